"""Train-step time and per-device memory of mesh layouts, as ratios against the first one.

    python bench/sharding_step.py --configs=small,base        # 8 simulated CPU devices
    python bench/sharding_step.py --devices=1 --contenders=1x1x1,unsharded --configs=base \
        --batch_size=256 --dtype=bfloat16 --attention_impl=cudnn   # one GPU: sharding is free

Contenders (`--contenders`, compared with the first, all in one process, steps interleaved
so that load changes hit them alike, as in bench/train_step.py):
  DxFxT           the trainer's step (training/steps.py: jit_train_step) on mesh (data, fsdp,
                  tensor), the state laid out by the default rules (training/state.py)
  DxFxT/flat      the same with config.model.projection_matmul forced to 'flat' (one 2-D
  DxFxT/general   matmul on the flattened kernel) or 'general' (dot_general over the heads
                  axis as it is); the plain form uses `--projection_matmul` (default 'auto':
                  flat on CPU, general on GPU/TPU)
  unsharded       the step as it was before sharding (f6bd050^): every leaf of the state
                  replicated over all devices, no activation constraints, 'flat' projections
The configs are bench/train_step.py's ("small", "base": the peers' encoder-decoders), the
same random batches, dropout 0.1, Adam(0.9, 0.98, 1e-9), label smoothing 0.1. Memory per
device is training/memory.py's: parameters and optimizer state from their shardings,
temporaries from the compiled step. Prints one JSON object per config.

On CPU the simulated devices share the machine's cores, so a step does the same arithmetic on
every mesh and the ratios show what the layout costs in collectives, copies and layouts
(XLA:CPU runs collectives as memory copies), not what an interconnect would.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--configs', default='small,base', help='bench/train_step.py configs')
  parser.add_argument('--contenders', default='8x1x1,2x4x1,2x1x4,2x1x4/general',
                      help='comma-separated; ratios are against the first')
  parser.add_argument('--devices', type=int, default=8,
                      help='simulated CPU devices (XLA_FLAGS); ignored on GPU/TPU')
  parser.add_argument('--steps', type=int, default=10, help='timed steps (after 3 warm-up)')
  parser.add_argument('--batch_size', type=int, default=None)
  parser.add_argument('--length', type=int, default=None)
  parser.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  parser.add_argument('--attention_impl', default='reference')
  parser.add_argument('--projection_matmul', default='auto', choices=['auto', 'flat', 'general'])
  parser.add_argument('--dropout', type=float, default=0.1)
  parser.add_argument('--attention_dropout', type=float, default=None)
  return parser.parse_args()


def contender(name: str, c: dict, batch: dict, args):
  """-> (run closure returning the loss, {'memory': per-device bytes, 'program': `program`},
  parameter count). JAX is imported here, after `main` has set XLA_FLAGS."""
  # After main() set XLA_FLAGS: JAX reads them once, at import (these modules import JAX).
  import jax
  import optax

  from bench import train_step as ts
  from model import ModelConfig, build
  from training import memory, mesh as mesh_lib, state as state_lib, steps

  layout, _, matmul = name.partition('/')
  old = layout == 'unsharded'
  matmul = 'flat' if old else (matmul or args.projection_matmul)
  config = ModelConfig.from_config(ts.model_config(
      c, args.dropout, ts.attention_dropout(args), dtype=args.dtype,
      attention_impl=args.attention_impl, projection_matmul=matmul))
  tx = optax.adam(5e-4, b1=0.9, b2=0.98, eps=1e-9)

  def schedule(_):
    return 5e-4

  if old:
    mesh = mesh_lib.make_mesh()  # every device on 'data'
    replicated = mesh_lib.replicated(mesh)
    state = jax.jit(state_lib.make_init_fn(config, tx),
                    out_shardings=replicated)(state_lib.seed_key(0))
    step = jax.jit(steps.make_train_step(config, tx, schedule, label_smoothing=0.1),
                   in_shardings=(replicated, mesh_lib.batch_sharding(mesh)),
                   out_shardings=(replicated, replicated), donate_argnums=0)
  else:
    data, fsdp, tensor = (int(s) for s in layout.split('x'))
    mesh_config = {'data': data, 'fsdp': fsdp, 'tensor': tensor}
    mesh, rules = mesh_lib.make_mesh(mesh_config=mesh_config), mesh_lib.rules(mesh_config)
    state = state_lib.create_train_state(config, tx, 0, mesh, rules)
    step = steps.jit_train_step(config, tx, schedule, mesh, label_smoothing=0.1, rules=rules)
  batch = jax.device_put(batch, mesh_lib.batch_sharding(mesh))
  compiled = step.lower(state, batch).compile()
  mem = memory.step_memory(compiled, state)
  holder = {'state': state}

  def run():
    holder['state'], metrics = compiled(holder['state'], batch)
    return metrics['loss']

  return run, {'memory': mem, 'program': program(compiled)}, build.count_params(state.params)


def program(compiled) -> dict:
  """What XLA compiled, to tell whether two steps are the same program: its instructions
  counted by (result shape, opcode), names and source locations left out, and its FLOPs and
  bytes accessed."""
  ops = collections.Counter()
  for line in compiled.as_text().splitlines():
    found = re.match(r'\s*(?:ROOT )?%?[\w.\-]+ = (.+?) ([a-z][\w\-]*)\(', line)
    if found:
      ops[found.groups()] += 1
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {'ops': ops, 'instructions': sum(ops.values()), 'flops': cost.get('flops'),
          'bytes_accessed': cost.get('bytes accessed')}


def bench_config(name: str, args, peak: float) -> dict:
  from bench import train_step as ts  # after main() set XLA_FLAGS (it imports JAX)
  c = dict(ts.CONFIGS[name])
  if args.batch_size:
    c['batch'] = args.batch_size
  if args.length:
    c['src_len'] = c['tgt_len'] = args.length
  batch = ts.random_batch(c)
  names = args.contenders.split(',')
  built = {n: contender(n, c, batch, args) for n in names}
  first, times = ts.time_steps({n: (run, p) for n, (run, _, p) in built.items()}, args.steps)
  flops = ts.train_flops(c)
  out = {'config': name, **c}
  base = names[0]
  base_ms = float(np.median(times[base])) * 1e3
  base_info = built[base][1]
  for n, (_, info, params) in built.items():
    s = ts.summarize(times[n], flops, c['batch'] * c['tgt_len'], peak)
    mem, prog = info['memory'], info['program']
    out[n] = {'params': params, 'first_step_s': first[n], 'ms_per_step_median':
              s['ms_per_step_median'], 'ms_p10': s['ms_p10'], 'ms_p90': s['ms_p90'],
              'memory_mib': {k: v / 2 ** 20 for k, v in mem.items()},
              f'time_ratio_vs_{base}': s['ms_per_step_median'] / base_ms,
              f'memory_ratio_vs_{base}': mem['total'] / base_info['memory']['total'],
              'hlo_instructions': prog['instructions'], 'hlo_flops': prog['flops'],
              'hlo_bytes_accessed': prog['bytes_accessed'],
              # the same instructions (shape, opcode) and costs: the same program
              f'same_program_as_{base}': (prog['ops'] == base_info['program']['ops'] and
                                          prog['flops'] == base_info['program']['flops'])}
  return out


def main():
  args = parse_args()
  flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_force_host_platform_device_count' not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={args.devices}'
  # Only now that XLA_FLAGS holds the device count: JAX reads it once, at import.
  import jax

  from bench import train_step as ts
  peak = ts.matmul_gflops(2048 if jax.default_backend() == 'cpu' else 8192, dtype=args.dtype)
  env = {'bench': 'sharding_step', 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
         'backend': jax.default_backend(), 'devices': jax.device_count(),
         'device': jax.devices()[0].device_kind, 'jax': jax.__version__, 'dtype': args.dtype,
         'attention_impl': args.attention_impl, 'steps': args.steps,
         'matmul_gflops': peak, 'cores': os.cpu_count()}
  for name in args.configs.split(','):
    print(json.dumps({**env, **bench_config(name, args, peak)}), flush=True)


if __name__ == '__main__':
  main()
