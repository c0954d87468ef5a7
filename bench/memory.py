"""Per-device memory of training presets on meshes of 8 and 64 simulated devices.

    python bench/memory.py                                   # bench/results/sharding.md's table
    python bench/memory.py --presets=lm_1b --devices=64 --meshes=64x1x1,8x8x1
    python bench/memory.py --presets=lm_1b --devices=8 --set=model.remat=False

For each preset, device count N and mesh (data x fsdp x tensor): the bytes one device holds of
the parameters and the optimizer state (from their shardings) and the compiled train step's
temporaries (activations, gradients, collective buffers: XLA's `memory_analysis`), which is
`training/memory.py: dry_run`, the figure `train.py --config.train.dry_run=True` prints.
Nothing runs and no data is read. One subprocess per N, with
XLA_FLAGS=--xla_force_host_platform_device_count=N on CPU, compiles every case of that N.

Temporaries grow with the rows each device gets: the preset's global batch is kept where
data x fsdp (x grad_accum_steps) divides it, else rounded up to the next multiple (wmt14's 104
rows on 64 batch shards -> 128), and reported as `batch_size` and `rows_per_device` (per
micro-batch). `tensor` does not split the batch, so its devices share rows. They are the CPU
compiler's figure: a GPU/TPU compiler fuses and schedules differently, so treat them as an
estimate there (parameters and optimizer state are exact on any backend).

Prints one JSON line per case as it finishes (stderr), then one JSON object with every case
and a Markdown table (stdout).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GIB = 2 ** 30
DEFAULT_PRESETS = 'wmt14_base,wmt14_big,lm_1b'
# data only (today's default: parameters replicated), FSDP only, FSDP within 8 devices (one
# host) x data across hosts, tensor parallelism 4 x data, and FSDP x tensor.
DEFAULT_MESHES = {8: '8x1x1,1x8x1,2x1x4,1x2x4', 64: '64x1x1,1x64x1,8x8x1,16x1x4,2x8x4'}


def load_config(spec: str, overrides: list[str]):
  """'wmt14_big', 'configs/wmt14_big.py' or 'configs/shakespeare_char.py:large' (a preset of
  configs/) with 'model.remat=False' overrides (values read as Python literals) -> the config
  `configs.resolve` gives."""
  from configs import resolve  # pylint: disable=import-outside-toplevel
  path, _, preset = spec.partition(':')
  name = os.path.splitext(os.path.basename(path))[0]
  values = {}
  for item in overrides:
    dotted, _, raw = item.partition('=')
    try:
      values[dotted] = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      values[dotted] = raw
  file = os.path.join(ROOT, 'configs', f'{name}.py')
  return resolve.resolve(f'{file}:{preset}' if preset else file, values, validate=False)[0]


def measure(case: dict) -> dict:
  """Compiles one (preset, mesh) train step on this process's devices -> its figures."""
  from training import memory  # after main() set XLA_FLAGS (JAX reads them once, at import)
  config = load_config(case['preset'], case['set'])
  data, fsdp, tensor = case['mesh']
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = data, fsdp, tensor
  shards = data * fsdp * config.train.grad_accum_steps
  config.train.batch_size = -(-config.train.batch_size // shards) * shards
  row = {'preset': case['preset'], 'devices': data * fsdp * tensor,
         'mesh': f'{data}x{fsdp}x{tensor}', 'batch_size': config.train.batch_size,
         'rows_per_device': config.train.batch_size // shards,  # per micro-batch
         'max_length': config.data.max_length, 'set': case['set']}
  try:
    report = memory.dry_run(config)
  except Exception as e:  # noqa: BLE001  (one case failing keeps the others)
    return {**row, 'error': f'{type(e).__name__}: {" ".join(str(e).split())[:400]}'}
  return {**row, 'parameters': report['parameters'], 'memory_bytes': report['memory'],
          'memory_gib': {k: round(v / GIB, 3) for k, v in report['memory'].items()},
          'compile_s': round(report['compile_s'], 1)}


def worker(cases_json: str) -> None:
  for case in json.loads(cases_json):
    print(json.dumps(measure(case)), flush=True)


def run_device_count(n: int, cases: list[dict], timeout: float) -> list[dict]:
  """Runs `cases` in a fresh Python with `n` CPU devices; -> their rows (progress to stderr)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'{os.environ.get("XLA_FLAGS", "")} '
                       f'--xla_force_host_platform_device_count={n}'.strip())
  cmd = [sys.executable, os.path.abspath(__file__), f'--_worker={json.dumps(cases)}']
  rows = []
  with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as proc:
    started = time.time()
    for line in proc.stdout:
      if line.startswith('{'):
        rows.append(json.loads(line))
        print(line.strip(), file=sys.stderr, flush=True)
      if time.time() - started > timeout:
        proc.kill()
        break
  done = {(r['preset'], r['mesh']) for r in rows}
  for case in cases:  # a crash or a timeout: the cases not reported say so
    mesh = 'x'.join(map(str, case['mesh']))
    if (case['preset'], mesh) not in done:
      rows.append({'preset': case['preset'], 'devices': n, 'mesh': mesh,
                   'error': f'not measured (worker rc {proc.returncode})'})
  return rows


def table(rows: list[dict]) -> str:
  header = ('| preset | devices | mesh (data x fsdp x tensor) | rows/device | params GiB | '
            'optimizer GiB | temporaries GiB | total GiB |')
  lines = [header, '|---|---|---|---|---|---|---|---|']
  for r in rows:
    if 'error' in r:
      lines.append(f'| {r["preset"]} | {r["devices"]} | {r["mesh"]} | | {r["error"]} | | | |')
      continue
    g = r['memory_gib']
    lines.append(f'| {r["preset"]} | {r["devices"]} | {r["mesh"]} | {r["rows_per_device"]} | '
                 f'{g["params"]:.3f} | {g["opt_state"]:.3f} | {g["temporaries"]:.3f} | '
                 f'**{g["total"]:.3f}** |')
  return '\n'.join(lines)


def parse_mesh(text: str) -> tuple[int, int, int]:
  sizes = tuple(int(s) for s in text.lower().split('x'))
  if len(sizes) != 3:
    raise argparse.ArgumentTypeError(f'mesh {text!r} is not DATAxFSDPxTENSOR')
  return sizes


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--presets', default=DEFAULT_PRESETS,
                  help='comma-separated configs/NAME.py[:preset] (or NAME[:preset])')
  ap.add_argument('--devices', default='8,64', help='comma-separated simulated device counts')
  ap.add_argument('--meshes', default=None, help='comma-separated DxFxT (default: a set per '
                  f'device count, {DEFAULT_MESHES})')
  ap.add_argument('--set', action='append', default=[],
                  help='config override for every preset, e.g. model.remat=False (repeatable)')
  ap.add_argument('--timeout', type=float, default=1800, help='seconds per device count')
  ap.add_argument('--_worker', default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args._worker is not None:  # pylint: disable=protected-access
    worker(args._worker)  # pylint: disable=protected-access
    return
  started = time.time()
  rows = []
  for n in (int(s) for s in args.devices.split(',')):
    meshes = [parse_mesh(m) for m in (args.meshes or DEFAULT_MESHES.get(n, f'{n}x1x1,1x{n}x1')
                                      ).split(',')]
    skipped = [m for m in meshes if m[0] * m[1] * m[2] != n]
    if skipped:
      print(f'bench/memory.py: meshes {skipped} do not have {n} devices; skipped',
            file=sys.stderr)
    meshes = [m for m in meshes if m not in skipped]
    cases = [{'preset': p, 'mesh': m, 'set': args.set}
             for p in args.presets.split(',') for m in meshes]
    rows += run_device_count(n, cases, args.timeout)
  report = {'bench': 'memory', 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
            'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores',
            'wall_s': round(time.time() - started, 1), 'cases': rows}
  print(json.dumps(report))
  print(table(rows))


if __name__ == '__main__':
  main()
