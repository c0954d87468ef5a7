"""What a process of this codebase costs before it does anything: the CPU time and wall time
of each command line's start, against a bare interpreter's measured in the same run.

    python bench/startup.py
    python bench/startup.py --python=/tmp/other/bin/python   # another environment beside it

Every command train.py, decode.py, sweep.py or a test starts pays its imports again (JAX,
Flax, ml_dtypes, ...): the suite starts ~100 of them, a sweep two per run. Each command runs
`--repeats` times, the interpreters and commands in rounds (one of each per round), so that a
drift of the machine's speed falls on all alike; CPU time is the child's user + system time
(`resource.getrusage(RUSAGE_CHILDREN)`), which another busy process on the machine changes
less than wall time.

Prints one JSON object: per interpreter and command, the median CPU and wall seconds and the
median CPU's ratio to that interpreter's bare start (`python -c pass`); with a second
interpreter, each command's CPU ratio of the second to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> the arguments after the interpreter. `bare` is the reference.
COMMANDS = {
    'bare': ['-c', 'pass'],
    'import numpy': ['-c', 'import numpy'],
    'import ml_dtypes': ['-c', 'import ml_dtypes'],
    'import jax': ['-c', 'import jax'],
    'import flax.nnx': ['-c', 'from flax import nnx'],
    'import configs': ['-c', 'import configs.resolve'],
    'train.py --help': ['train.py', '--help'],
    'decode.py --help': ['decode.py', '--help'],
    'sweep.py --help': ['sweep.py', '--help'],
    'experiments.report --help': ['-m', 'experiments.report', '--help'],
}
REFERENCE = 'bare'


def versions(python: str) -> dict:
  """The interpreter's Python and the versions of the packages whose import dominates."""
  code = ('import json, sys, importlib.metadata as m\n'
          'found = {"python": sys.version.split()[0]}\n'
          'for name in ("numpy", "ml_dtypes", "jax", "jaxlib", "flax"):\n'
          '  try: found[name] = m.version(name)\n'
          '  except m.PackageNotFoundError: found[name] = None\n'
          'print(json.dumps(found))')
  return json.loads(subprocess.run([python, '-c', code], capture_output=True, text=True,
                                   check=True).stdout)


def timed(python: str, args: list[str]) -> tuple[float, float]:
  """(CPU seconds, wall seconds) of `python ARGS` run to its end in the repository."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  proc = subprocess.run([python, *args], cwd=REPO, capture_output=True, check=False,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if proc.returncode != 0:
    raise SystemExit(f'startup.py: {python} {" ".join(args)} exited {proc.returncode}: '
                     f'{proc.stderr.decode(errors="replace").strip().splitlines()[-1:]}')
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return cpu, wall


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--python', action='append', default=[],
                      help='another interpreter to measure beside this one (repeatable)')
  parser.add_argument('--repeats', type=int, default=7)
  args = parser.parse_args()
  if args.repeats < 1:
    parser.error(f'--repeats={args.repeats} must be at least 1')
  pythons = [sys.executable, *args.python]
  for python in pythons:
    timed(python, COMMANDS[REFERENCE])  # one start to warm the file cache
  samples = {(p, name): [] for p in pythons for name in COMMANDS}
  for _ in range(args.repeats):
    for name, command in COMMANDS.items():
      for python in pythons:
        samples[python, name].append(timed(python, command))
  results = []
  for python in pythons:
    cpu = {name: statistics.median(c for c, _ in samples[python, name]) for name in COMMANDS}
    results.append({
        'python': python, 'versions': versions(python),
        'commands': {name: {'cpu_s': round(cpu[name], 3),
                            'wall_s': round(statistics.median(w for _, w in
                                                              samples[python, name]), 3),
                            'cpu_vs_bare': round(cpu[name] / cpu[REFERENCE], 2)}
                     for name in COMMANDS}})
  report = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
            'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs',
            'command': ' '.join(['python', 'bench/startup.py', *sys.argv[1:]]),
            'repeats': args.repeats, 'interpreters': results}
  if len(pythons) > 1:
    first = results[0]['commands']
    report['cpu_ratio_to_first'] = {
        other['python']: {name: round(other['commands'][name]['cpu_s'] / first[name]['cpu_s'], 2)
                          for name in COMMANDS}
        for other in results[1:]}
  print(json.dumps(report, indent=1))


if __name__ == '__main__':
  main()
