"""Command lines of train.py, decode.py, export.py and import.py run one after another in one
interpreter, each through its main (flag parsing included): a process per command line spent
~1-1.5 s of CPU on interpreter and JAX start-up (~3 s more where it imports torch). For
command lines that refuse, show, translate or train briefly; a test of how a process ends
(signals, exit paths that skip clean-up) starts its own."""

import json
import subprocess
import sys

from tests.training import test_train_synthetic as syn

_MAIN_PER_ARGS = """
import contextlib, importlib, io, json, sys
from absl import flags
from workdir import cli
FLAGS = flags.FLAGS
results, defined = [], set()
for script, args in json.loads(sys.argv[1]):
  for name in defined:  # the previous script's own flags (train.py: --config's fields too)
    delattr(FLAGS, name)
  FLAGS.unparse_flags()
  module = importlib.import_module(script.removesuffix('.py'))  # `import` is a keyword
  before = set(FLAGS)  # libraries' flags, defined as they are imported, stay
  sys.argv = [script, *args]
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      if script == 'train.py':  # defines its flags as it parses (--config's fields)
        try:
          argv = module.parse_flags(sys.argv)
        finally:
          defined = set(FLAGS) - before
        module.main(argv)
      else:
        module._define_flags()
        defined = set(FLAGS) - before
        module.main(cli.parse_absl_flags(script, sys.argv))
      code = 0
    except SystemExit as e:
      code = e.code
  results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def run_mains(runs: list, script: str = 'decode.py', cwd: str = syn.REPO,
              devices: int | None = None) -> list[tuple[int, str, str]]:
  """(exit status, stdout, stderr) of `SCRIPT ARGS` for each ARGS (a list of strings) of
  `runs`, where a run may also be a (SCRIPT, ARGS) pair to run another script; from `cwd`, on
  `devices` simulated CPU devices (None: the suite's XLA flags as they are, so that decoding
  finds the programs the in-process tests compiled)."""
  runs = [run if isinstance(run, tuple) else (script, run) for run in runs]
  proc = subprocess.run([sys.executable, '-c', _MAIN_PER_ARGS, json.dumps(runs)], cwd=cwd,
                        env=syn.subprocess_env(devices), stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [tuple(result) for result in json.loads(proc.stdout)]


def dropped_ctrl_c(script: str, when: str) -> str:
  """`python -c` source running `script`'s __main__ (sys.argv[1:]) after a gc callback that,
  the first time the Python expression `when` holds (names: sys, frames: the callback's
  callers), sends SIGINT to the process: its KeyboardInterrupt is raised inside the callback,
  where Python drops it, as when a Ctrl-C lands in JAX's gc callback."""
  return f'''
import gc, os, runpy, signal, sys

def ctrl_c_in_a_gc_callback(phase, info):
  frames, frame = [], sys._getframe()
  while frame:
    frames.append(frame)
    frame = frame.f_back
  if phase == 'start' and not sent and ({when}):
    sent.append(1)
    os.kill(os.getpid(), signal.SIGINT)

sent = []
gc.callbacks.append(ctrl_c_in_a_gc_callback)
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name='__main__')
'''
