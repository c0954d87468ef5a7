"""The GPU targets in one command: training and decoding speed, the one-device cost of
sharding and the GPU presets' quality, one process per measurement.

    python bench/gpu_targets.py --flax_wmt_dir=~/peers/flax/examples/wmt \
        --decode_workdir=runs/multi30k > gpu_targets.json

Runs, one after the other (each bench prints JSON; this collects them):
  train_bf16    bench/train_step.py --config=base --batch_size=256 --dtype=bfloat16, ours
                (--attention_impl, default 'cudnn') beside the Flax WMT example:
                >= 2x its tokens/s, >= 50% of a bf16 8192^3 matmul measured in-process
  train_f32     the same in float32 (attention 'xla'), beside the example (reported)
  first_step    the base model's first step (compile) with --scan_layers: <= 10 s
  decode        bench/decode.py --platform=gpu --configs=small --batch_size=16 (beam 4 and
                greedy, 32 steps; --peer times the Flax WMT beam search too): <= 25 / 10 ms
  decode_cli    decode.py on test2016 (1000 sentences, beam 4, batch 64), no compilation
                cache, wall time: <= 10 s (needs --decode_workdir, a trained multi30k run)
  shakespeare   train.py --config=configs/shakespeare_char.py:large in bfloat16, wall time
                and tokens/s over the whole run: >= 2x nanoGPT's 1.09M tok/s (its GPU run);
                the run's best validation loss: <= 1.47 (nanoGPT's README)
  sharding_1dev bench/sharding_step.py --devices=1 on the base model (batch 256, bf16): the
                trainer's step on mesh (1,1,1) against the step before sharding (state
                replicated, no activation constraints, 'flat' projections) in the same
                process, and mesh (1,1,1) with 'flat' projections: sharding costs nothing on
                one device, <= 1.03x the old step's time
  multi30k_gpu  bench/multi30k_recipe.py --config=configs/multi30k.py:gpu: train (<= 10 min),
                decoding tuned on validation (9 points, MULTI30K_GPU_GRID), test2016 once:
                >= 41 lowercased tokenized BLEU; a device call of its own, so
                not in the default set
`--only=a,b` runs a subset: a lent machine runs one command for at most 10 minutes, so
split the targets over calls (bench/RESULTS.md, "GPU session plan"). Prints one JSON object
to stdout: per target the measurement, the target, `met`, and the bench's own JSON under
`raw`; stderr gets each bench's output as it runs and each target's JSON as it ends.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NANOGPT_TOKENS_PER_S = 1.09e6  # nanoGPT shakespeare_char on one H100, bf16
SHAKESPEARE_BEST_VAL_LOSS = 1.47  # nanoGPT's README figure, 1.4697
TEST2016 = os.path.join(ROOT, 'data', 'multi30k', 'test_2016_flickr')  # + .en.gz / .de.gz


def json_lines(text: str) -> list[dict]:
  """The JSON objects a bench printed, one per line (other lines ignored)."""
  found = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith('{') and line.endswith('}'):
      try:
        found.append(json.loads(line))
      except ValueError:
        pass
  return found


def run_text(args: list[str], timeout: int) -> tuple[str, float, str]:
  """Runs a command from the checkout: (its stdout, wall seconds, stderr tail if it failed).

  The command's output is echoed to our stderr line by line as it comes, so a log of a call
  that a device's time limit stops still shows every measurement finished before it.
  """
  start = time.perf_counter()
  stdout, stderr = [], collections.deque(maxlen=100)
  # A session of its own: on a timeout (or Ctrl-C) the whole group goes, its own children too
  # (train.py's Grain workers), which would otherwise hold the pipes open.
  with subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True, start_new_session=True) as proc:
    pumps = [threading.Thread(target=_echo, args=(proc.stdout, stdout)),
             threading.Thread(target=_echo, args=(proc.stderr, stderr))]
    for pump in pumps:
      pump.start()
    try:
      proc.wait(timeout)
    except BaseException:
      os.killpg(proc.pid, signal.SIGKILL)
      raise
    finally:
      for pump in pumps:
        pump.join()
  wall = time.perf_counter() - start
  return ''.join(stdout), wall, '' if proc.returncode == 0 else ''.join(stderr)[-2000:]


def _echo(stream, kept) -> None:
  for line in stream:
    sys.stderr.write(line)
    sys.stderr.flush()
    kept.append(line)


def run(args: list[str], timeout: int) -> tuple[list[dict], float, str]:
  """Runs a command from the checkout: (its JSON lines, wall seconds, stderr tail)."""
  stdout, wall, error = run_text(args, timeout)
  return json_lines(stdout), wall, error


def best_val_loss(train_stdout: str) -> float | None:
  """The loss in train.py's last line, `done: ... | best val loss 1.4697 (step 2000) ...`."""
  found = re.findall(r'best val loss ([\d.]+) \(step \d+\)', train_stdout)
  return float(found[-1]) if found else None


# The commands, shared with bench/accelerator_check.py.
def train_step_cmd(dtype: str, steps: int, impl: str | None = None, flax_wmt_dir=None,
                   extra=()) -> list[str]:
  """bench/train_step.py on the paper's base model at batch 256 x 64."""
  cmd = [sys.executable, 'bench/train_step.py', '--config=base', '--batch_size=256',
         f'--dtype={dtype}', f'--steps={steps}', *extra]
  if impl:
    cmd.append(f'--attention_impl={impl}')
  if flax_wmt_dir:
    cmd.append(f'--flax_wmt_dir={flax_wmt_dir}')
  return cmd


def decode_bench_cmd(platform: str, reps: int, extra=()) -> list[str]:
  """bench/decode.py on the 'small' model: greedy and beam 4."""
  return [sys.executable, 'bench/decode.py', f'--platform={platform}', '--configs=small',
          f'--reps={reps}', *extra]


def decode_test2016_cmd(workdir: str, output_file: str, extra=()) -> list[str]:
  """decode.py on test2016 with no compilation cache (a cold start, as a new user has)."""
  return [sys.executable, 'decode.py', f'--workdir={workdir}', f'--input_file={TEST2016}.en.gz',
          f'--output_file={output_file}', '--compilation_cache=', *extra]


def train(a, dtype: str, impl: str, extra=()) -> dict:
  lines, _, error = run(train_step_cmd(dtype, a.steps, impl, a.flax_wmt_dir, extra), a.timeout)
  return {'raw': lines[-1] if lines else None, 'error': error}


def target_train_bf16(a) -> dict:
  out = train(a, 'bfloat16', a.attention_impl)
  raw = out['raw'] or {}
  ours = raw.get('ours', {})
  out.update(ms_per_step=ours.get('ms_per_step_median'),
             fraction_of_bf16_matmul=ours.get('fraction_of_matmul'),
             speedup_vs_flax_wmt=raw.get('speedup_vs_flax_wmt'),
             target='>= 2x Flax WMT, >= 0.5 of the bf16 matmul')
  out['met'] = (None if out['speedup_vs_flax_wmt'] is None or ours == {} else
                out['speedup_vs_flax_wmt'] >= 2 and ours['fraction_of_matmul'] >= 0.5)
  return out


def target_train_f32(a) -> dict:
  out = train(a, 'float32', 'xla')
  raw = out['raw'] or {}
  out.update(ms_per_step=raw.get('ours', {}).get('ms_per_step_median'),
             speedup_vs_flax_wmt=raw.get('speedup_vs_flax_wmt'), target='reported', met=None)
  return out


def target_first_step(a) -> dict:
  out = train(a, 'bfloat16', a.attention_impl, ('--scan_layers', '--steps=1'))
  first = (out['raw'] or {}).get('ours', {}).get('first_step_s')
  out.update(first_step_s=first, target='<= 10 s', met=None if first is None else first <= 10)
  return out


def target_decode(a) -> dict:
  cmd = decode_bench_cmd('gpu', 20, ['--batch_size=16', '--max_foreign=100'])
  if a.flax_wmt_dir:
    cmd.append('--peer')
  env_dir = os.path.expanduser(a.flax_wmt_dir) if a.flax_wmt_dir else None
  if env_dir:
    os.environ['FLAX_WMT_DIR'] = env_dir
  lines, _, error = run(cmd, a.timeout)
  by_method = {line['method']: line for line in lines if 'method' in line}
  beam = by_method.get('beam4', {}).get('median_ms')
  greedy = by_method.get('greedy', {}).get('median_ms')
  return {'raw': lines, 'error': error, 'beam4_ms': beam, 'greedy_ms': greedy,
          'target': 'beam 4 <= 25 ms, greedy <= 10 ms per batch of 16',
          'met': None if beam is None or greedy is None else beam <= 25 and greedy <= 10}


def target_decode_cli(a) -> dict:
  if not a.decode_workdir:
    return {'met': None, 'target': '<= 10 s cold',
            'error': 'not run: pass --decode_workdir (a trained multi30k workdir)'}
  with tempfile.TemporaryDirectory() as tmp:
    cmd = decode_test2016_cmd(a.decode_workdir, f'{tmp}/out.de',
                              ['--beam_size=4', '--batch_size=64'])
    _, wall, error = run(cmd, a.timeout)
  return {'wall_s': wall, 'error': error, 'target': '<= 10 s cold (no compilation cache)',
          'met': None if error else wall <= 10}


def target_shakespeare(a) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, 'train.py', '--config=configs/shakespeare_char.py:large',
           '--config.model.dtype=bfloat16', f'--workdir={tmp}']
    stdout, wall, error = run_text(cmd, a.timeout)
  tokens = 5000 * 64 * 256  # the preset's steps x batch x block
  rate, loss = tokens / wall, best_val_loss(stdout)
  speed_met = None if error else rate >= 2 * NANOGPT_TOKENS_PER_S
  loss_met = None if loss is None else loss <= SHAKESPEARE_BEST_VAL_LOSS
  return {'wall_s': wall, 'tokens_per_s_whole_run': rate, 'best_val_loss': loss,
          'error': error, 'speed_met': speed_met, 'loss_met': loss_met,
          'target': f'>= 2x nanoGPT ({NANOGPT_TOKENS_PER_S:.3g} tok/s); best val '
                    f'loss <= {SHAKESPEARE_BEST_VAL_LOSS} (nanoGPT)',
          'met': None if speed_met is None or loss_met is None else speed_met and loss_met}


def target_sharding_1dev(a) -> dict:
  cmd = [sys.executable, 'bench/sharding_step.py', '--devices=1', '--configs=base',
         '--contenders=unsharded,1x1x1,1x1x1/flat', '--batch_size=256', '--dtype=bfloat16',
         f'--attention_impl={a.attention_impl}', f'--steps={a.steps}']
  lines, _, error = run(cmd, a.timeout)
  raw = lines[-1] if lines else {}
  ratio = raw.get('1x1x1', {}).get('time_ratio_vs_unsharded')
  flat = raw.get('1x1x1/flat', {})
  # '1x1x1' multiplies 'general' on a GPU (auto), the old step 'flat': '1x1x1/flat' is the
  # same program as the old step if sharding adds nothing (it does on CPU:
  # bench/results/sharding.md).
  return {'raw': raw or None, 'error': error, 'time_ratio_vs_unsharded': ratio,
          'flat_time_ratio_vs_unsharded': flat.get('time_ratio_vs_unsharded'),
          'flat_same_program_as_unsharded': flat.get('same_program_as_unsharded'),
          'target': 'mesh (1,1,1) <= 1.03x the step before sharding',
          'met': None if ratio is None else ratio <= 1.03}


# The validation grid on a GPU: CPU try 3's (bench/results/multi30k.md) without what never won there
# (beam 4 was within noise of 6, alpha 0.6 always last) and with alpha 1.8 beyond its best
# edge: 9 decodes instead of 24, so train + grid + test fit one 10-minute device call.
MULTI30K_GPU_GRID = ('--averages=1,5,10', '--beams=6', '--alphas=1.0,1.4,1.8')


def target_multi30k_gpu(a) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    workdir = a.multi30k_workdir or f'{tmp}/m30_gpu'
    cmd = [sys.executable, 'bench/multi30k_recipe.py', '--config=configs/multi30k.py:gpu',
           f'--workdir={workdir}', *MULTI30K_GPU_GRID]
    lines, _, error = run(cmd, max(a.timeout, 3600))
  raw = lines[-1] if lines else {}
  test, wall = raw.get('test2016', {}), raw.get('train_wall_s')
  return {'raw': raw or None, 'error': error, 'train_wall_s': wall,
          'test2016_bleu_lowercased': test.get('bleu_lowercased'),
          'test2016_bleu': test.get('bleu'),
          'target': '>= 41 lowercased tokenized BLEU on test2016, training <= 600 s',
          'met': None if not test or wall is None else
                 test['bleu_lowercased'] >= 41 and wall <= 600}


TARGETS = {'train_bf16': target_train_bf16, 'train_f32': target_train_f32,
           'first_step': target_first_step, 'decode': target_decode,
           'decode_cli': target_decode_cli, 'shakespeare': target_shakespeare,
           'sharding_1dev': target_sharding_1dev, 'multi30k_gpu': target_multi30k_gpu}
DEFAULT_TARGETS = [name for name in TARGETS if name != 'multi30k_gpu']


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--only', default=','.join(DEFAULT_TARGETS),
                      help=f'comma-separated targets, of {",".join(TARGETS)}')
  parser.add_argument('--attention_impl', default='cudnn', help='for the bf16 train step')
  parser.add_argument('--flax_wmt_dir', default=None, help='google/flax examples/wmt checkout')
  parser.add_argument('--decode_workdir', default=None, help='a trained multi30k workdir')
  parser.add_argument('--multi30k_workdir', default=None,
                      help='multi30k_gpu trains here (kept: bench/multi30k_recipe.py '
                           '--skip_train re-tunes it); default a temporary directory')
  parser.add_argument('--steps', type=int, default=20, help='timed train steps')
  parser.add_argument('--timeout', type=int, default=1200, help='seconds per measurement')
  a = parser.parse_args()
  report = {'bench': 'gpu_targets', 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
  for name in a.only.split(','):
    try:
      report[name] = TARGETS[name](a)
    except subprocess.TimeoutExpired:
      report[name] = {'met': None, 'error': f'timed out after {a.timeout} s'}
    print(json.dumps({name: report[name]}), file=sys.stderr, flush=True)  # progress
  report['all_met'] = all(r.get('met') is True for k, r in report.items()
                          if isinstance(r, dict) and r.get('target') != 'reported')
  print(json.dumps(report))


if __name__ == '__main__':
  main()
