"""Check an accelerator machine in one call: the test suite, the train step at accelerator
sizes, decoding speed and the default run end to end, as one table (and a JSON file).

    python bench/accelerator_check.py                                  # whatever is present
    python bench/accelerator_check.py --flax_wmt_dir=PATH/flax/examples/wmt   # + the peer

Parts, in order of importance, each a subprocess with its own time limit; together they fit
`--budget_s` (default 9 minutes): a part that would not fit is reported as not run.

  cudnn tests  tests/model/test_attention_impls.py -k cudnn, one process, -x: the GPU-only kernels
  tests        python -m pytest -n N (xdist workers sized to the machine), no GPU memory
               preallocation; the suite itself runs at the highest matmul precision
  resume       bench/resume_check.py: train.py with deterministic=True, straight and resumed
               halfway, the parameters compared bit for bit on the accelerator
  train bf16   bench/train_step.py: the paper's base model, batch 256 x 64, bfloat16 (with the
               Flax WMT example in the same process when --flax_wmt_dir is given)
  decode       bench/decode.py, 'small': greedy and beam 4, batch 16, 32 tokens
  default run  train.py (configs/default.py) then decode.py on test2016: BLEU and wall times
  train f32    as train bf16, in float32

The JSON (`--out`, default runs/accelerator_check/result.json) holds every figure, and the
logs of each part lie beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.gpu_targets import (  # noqa: E402
  ROOT,
  TEST2016,
  decode_bench_cmd,
  decode_test2016_cmd,
  json_lines,
  train_step_cmd,
)


def run_part(name: str, cmd: list[str], limit_s: float, log_dir: str, env: dict) -> dict:
  """Runs `cmd` in the repo root with a time limit; -> {'rc', 'wall_s', 'stdout', 'log'}."""
  log = os.path.join(log_dir, f'{name.replace(" ", "_")}.log')
  start = time.time()
  with open(log, 'w') as f:
    f.write('$ ' + ' '.join(cmd) + '\n')
    f.flush()
    try:
      proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=limit_s)
      out, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
      out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or '')
      rc = 'timeout'
    f.write(out)
  return {'rc': rc, 'wall_s': round(time.time() - start, 1), 'stdout': out, 'log': log}


def device_info(env: dict) -> dict:
  code = ('import jax, json; d = jax.devices()[0]; print(json.dumps({"backend": '
          'jax.default_backend(), "device": d.device_kind, "count": jax.device_count(), '
          '"jax": jax.__version__}))')
  proc = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
  found = json_lines(proc.stdout)
  return found[-1] if found else {'backend': 'unknown', 'error': proc.stderr.strip()[-300:]}


def pytest_workers(backend: str) -> int:
  """xdist workers: one per two cores on an accelerator (each holds a GPU context), at most
  6 (measured to fit an 80 GB H100 without preallocation); every core on a CPU."""
  cores = os.cpu_count() or 1
  return max(1, min(6, cores // 2)) if backend != 'cpu' else cores


def summarize_tests(part: dict) -> dict:
  """Counts from pytest's last line or, when the part was stopped at its limit before that
  line, from the per-test lines (-v) that came before: what had finished still counts."""
  out = part['stdout']
  counts = {k: int(n) for n, k in re.findall(
      r'(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)', out[-3000:])}
  if not counts:
    # '[gw0] [ 1%] PASSED tests/...' (xdist) or 'tests/... PASSED [ 1%]' (one process)
    for outcome in re.findall(r'(?:^|\] )(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) tests/'
                              r'|^tests/\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)', out,
                              flags=re.M):
      outcome = outcome[0] or outcome[1]
      key = {'XFAIL': 'xfailed', 'XPASS': 'xpassed', 'ERROR': 'errors'}.get(outcome,
                                                                          outcome.lower())
      counts[key] = counts.get(key, 0) + 1
    counts['stopped_early'] = part['rc'] == 'timeout'
  counts['errors'] = counts.pop('error', 0) + counts.pop('errors', 0)
  failed = re.findall(r'^(?:FAILED|ERROR) (\S+)', out, flags=re.M)
  failed += re.findall(r'^\[gw\d+\] \[ *\d+%\] (?:FAILED|ERROR) (\S+)', out, flags=re.M)
  failed += re.findall(r'^(tests/\S+) (?:FAILED|ERROR)', out, flags=re.M)
  return {**counts, 'failed_tests': sorted(set(failed))[:40]}


def summarize_train(part: dict) -> dict:
  found = [r for r in json_lines(part['stdout']) if r.get('bench') == 'train_step']
  if not found:
    return {}
  r, out = found[-1], {}
  ours = r.get('ours', {})
  out['ms_per_step'] = ours.get('ms_per_step_median')
  out['target_tokens_per_s'] = ours.get('target_tokens_per_s')
  out['fraction_of_matmul'] = ours.get('fraction_of_matmul')
  out['first_step_s'] = ours.get('first_step_s')
  if 'flax_wmt' in r:
    out['flax_wmt_ms_per_step'] = r['flax_wmt'].get('ms_per_step_median')
    out['speedup_vs_flax_wmt'] = r.get('speedup_vs_flax_wmt')
  return out


def summarize_decode(part: dict) -> dict:
  out = {}
  for r in json_lines(part['stdout']):
    if r.get('config') == 'small' and 'median_ms' in r:
      out[f'{r["method"]}_ms_per_batch'] = r['median_ms']
  return out


def summarize_resume(part: dict) -> dict:
  found = [r for r in json_lines(part['stdout']) if r.get('bench') == 'resume_check']
  return {k: found[-1][k] for k in ('backend', 'bitwise_equal', 'leaves_differing',
                                    'max_abs_diff')} if found else {}


def summarize_default_run(train: dict, decode: dict) -> dict:
  out = {'train_wall_s': train['wall_s'], 'train_rc': train['rc']}
  steps = re.findall(r'step (\d+)/\d+ .*?([\d,]+) tok/s', train['stdout'])
  if steps:
    out['last_tokens_per_s'] = int(steps[-1][1].replace(',', ''))
  first = re.search(r'(?:first step \(compilation \+ one step\): |compiled the train step in )'
                    r'([\d.]+)s', train['stdout'])  # either wording (older and newer train.py)
  if first:
    out['first_step_s'] = float(first.group(1))
  if decode is not None:
    out.update(decode_wall_s=decode['wall_s'], decode_rc=decode['rc'])
    bleu = re.search(r'^BLEU = ([\d.]+)', decode['stdout'], flags=re.M)
    if bleu:
      out['test2016_bleu'] = float(bleu.group(1))
  return out


def plan(args, info: dict, out_dir: str) -> list[tuple[str, list[str], float]]:
  """(name, command, time limit in s) of each part, in order of importance."""
  py = sys.executable
  workers = args.test_workers or pytest_workers(info.get('backend', 'cpu'))
  # -vv (pyproject's addopts has -q): one line per finished test, so a suite stopped at its
  # limit still reports what ran.
  tests = [py, '-m', 'pytest', '-vv', '-p', 'no:cacheprovider', '--no-header', '-rfE',
           '--durations=25']
  # The GPU-only kernels first, in one process, stopping at the first failure so that its
  # traceback is printed within the part's limit (on 2026-11-27 four failed and the limit
  # cut the report).
  cudnn = [*tests[:-1], '-n', '0', '-x', '--tb=short', '-k', 'cudnn',
           'tests/model/test_attention_impls.py']
  if workers > 1 and _has_xdist():
    tests += ['-n', str(workers)]
  run_dir = os.path.join(out_dir, 'default_run')
  return [
      ('cudnn tests', cudnn, 120),
      ('tests', tests, args.tests_limit_s),
      ('resume', [py, 'bench/resume_check.py', '--steps=20'], 150),
      ('train bf16', train_step_cmd('bfloat16', 20, flax_wmt_dir=args.flax_wmt_dir), 150),
      ('decode', decode_bench_cmd('auto', 10), 90),
      ('default run', [py, 'train.py', f'--workdir={run_dir}', *args.default_run_args.split()],
       200),
      ('default run decode', decode_test2016_cmd(run_dir, f'{run_dir}/test2016.de',
                                                 [f'--reference={TEST2016}.de.gz']), 90),
      ('train f32', train_step_cmd('float32', 20, flax_wmt_dir=args.flax_wmt_dir), 150),
  ]


def _has_xdist() -> bool:
  try:
    import xdist  # noqa: F401  (an optional test dependency: only whether it is there)
    return True
  except ImportError:
    return False


def table(result: dict) -> str:
  """The figures as one Markdown table."""
  rows = [('device', f'{result["device"].get("device")} x{result["device"].get("count")} '
                     f'({result["device"].get("backend")}, jax {result["device"].get("jax")})')]
  for name, part in result['parts'].items():
    if part.get('rc') == 'not run':
      rows.append((name, f'not run ({part["why"]})'))
      continue
    figures = {k: v for k, v in part.items() if k not in ('rc', 'log', 'failed_tests')}
    text = ', '.join(f'{k} {_fmt(v)}' for k, v in figures.items() if v is not None)
    status = 'ok' if part.get('rc') == 0 else f'rc {part.get("rc")}'
    rows.append((name, f'{status}: {text}'))
  failed = result['parts'].get('tests', {}).get('failed_tests')
  if failed:
    rows.append(('failed tests', ' '.join(failed)))
  rows.append(('total wall', f'{result["wall_s"]:.0f} s'))
  return '\n'.join(['| part | figures |', '|---|---|'] + [f'| {a} | {b} |' for a, b in rows])


def _fmt(value) -> str:
  if isinstance(value, float):
    return f'{value:.3g}' if abs(value) < 100 else f'{value:,.0f}'
  return str(value)


SUMMARIES = {'cudnn tests': summarize_tests, 'tests': summarize_tests,
             'train bf16': summarize_train, 'train f32': summarize_train,
             'decode': summarize_decode, 'resume': summarize_resume}


def _write_json(path: str, result: dict) -> None:
  """`result` into `path`, whole or not at all (a reader never sees half a file)."""
  with open(path + '.tmp', 'w') as f:
    json.dump(result, f, indent=2)
  os.replace(path + '.tmp', path)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--flax_wmt_dir', default=None, help='google/flax examples/wmt checkout')
  ap.add_argument('--budget_s', type=float, default=540, help='wall-time budget of all parts')
  ap.add_argument('--out', default=os.path.join(ROOT, 'runs', 'accelerator_check',
                                                'result.json'))
  ap.add_argument('--tests_limit_s', type=float, default=300, help="the suite's time limit")
  ap.add_argument('--test_workers', type=int, default=0,
                  help='xdist workers of the suite (0: one per two cores, at most 6)')
  ap.add_argument('--skip', default='', help='comma-separated parts to leave out')
  ap.add_argument('--default_run_args', default='',
                  help="extra train.py flags of the default run, e.g. a quick smoke check: "
                       "'--config=configs/default.py:tiny'")
  args = ap.parse_args()
  if os.path.isdir(args.out):
    ap.error(f'--out={args.out} is a directory (give the JSON file to write)')
  out_dir = os.path.dirname(os.path.abspath(args.out))
  try:
    os.makedirs(out_dir, exist_ok=True)
  except OSError as e:
    ap.error(f'cannot create the folder of --out={args.out}: {e.strerror or e}')
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false', PYTHONUNBUFFERED='1')
  bench_env = dict(env, JAX_PLATFORMS=env.get('JAX_PLATFORMS', ''))  # benches: any backend
  shutil.rmtree(os.path.join(out_dir, 'default_run'), ignore_errors=True)  # train anew
  start = time.time()
  info = device_info(bench_env)
  result = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'device': info,
            'parts': {}}
  runs = {}
  for name, cmd, limit in plan(args, info, out_dir):
    left = args.budget_s - (time.time() - start)
    skipped = name.split()[0] in args.skip.split(',') or name in args.skip.split(',')
    if skipped or left < min(limit, 60) or (name == 'default run decode' and
                                             runs.get('default run', {}).get('rc') != 0):
      result['parts'][name] = {'rc': 'not run', 'why': 'skipped' if skipped else 'budget'}
      continue
    part_env = env if name.endswith('tests') else bench_env
    runs[name] = part = run_part(name, cmd, min(limit, left), out_dir, part_env)
    summary = SUMMARIES.get(name, lambda p: {})(part)
    result['parts'][name] = {'rc': part['rc'], 'wall_s': part['wall_s'], **summary,
                             'log': part['log']}
    print(f'[{time.time() - start:5.0f}s] {name}: rc {part["rc"]}, {part["wall_s"]} s',
          file=sys.stderr, flush=True)
    result['wall_s'] = time.time() - start
    _write_json(args.out, result)  # after each part: a device call cut at its limit keeps them
  if 'default run' in runs:
    result['parts']['default run'].update(
        summarize_default_run(runs['default run'], runs.get('default run decode')))
  result['wall_s'] = time.time() - start
  _write_json(args.out, result)
  print(table(result))
  print(f'JSON: {args.out}')


if __name__ == '__main__':
  main()
