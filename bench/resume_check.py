"""Is a resume bitwise exact on this backend? train.py with `config.train.deterministic=True`
runs the same steps twice: straight through, and stopped halfway then resumed from its
checkpoint; the two final parameter sets are compared bit for bit.

    python bench/resume_check.py [--steps=20] [--config=configs/default.py:tiny] [--out=DIR]

Runs on JAX's default backend (the GPU of an accelerator machine; the suite's own bitwise
resume tests run on the CPU). Prints one JSON object: the backend, whether every parameter
is bitwise equal, how many differ, and the largest absolute difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(workdir: str, config: str, steps: int, total: int) -> None:
  """train.py to `steps` (a second call with more resumes), checkpoints every `total // 2`
  (test_train_cli's pattern: the preset's schedule does not depend on num_steps)."""
  cmd = [sys.executable, 'train.py', f'--config={config}', f'--workdir={workdir}',
         f'--config.train.num_steps={steps}',
         f'--config.train.checkpoint_every_steps={total // 2}',
         f'--config.train.eval_every_steps={total}', '--config.train.deterministic=True']
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    sys.exit(f'train.py failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}')


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--steps', type=int, default=20, help='steps in all (even)')
  ap.add_argument('--config', default='configs/default.py:tiny')
  ap.add_argument('--out', default=None, help='where the two workdirs go (default: a temp dir)')
  args = ap.parse_args()
  out = args.out or tempfile.mkdtemp(prefix='resume_check_')
  straight, resumed = os.path.join(out, 'straight'), os.path.join(out, 'resumed')
  _train(straight, args.config, args.steps, args.steps)
  _train(resumed, args.config, args.steps // 2, args.steps)
  _train(resumed, args.config, args.steps, args.steps)

  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  sys.path.insert(0, ROOT)
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  a, step_a = checkpoint.restore_params(straight)
  b, step_b = checkpoint.restore_params(resumed)
  pairs = list(zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
  differ = [i for i, (x, y) in enumerate(pairs) if not np.array_equal(np.asarray(x),
                                                                        np.asarray(y))]
  largest = max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                 for x, y in pairs), default=0.0)
  print(json.dumps({'bench': 'resume_check', 'backend': jax.default_backend(),
                    'device': str(jax.devices()[0]), 'steps': [step_a, step_b],
                    'config': args.config, 'bitwise_equal': not differ and step_a == step_b,
                    'leaves': len(pairs), 'leaves_differing': len(differ),
                    'max_abs_diff': largest}))


if __name__ == '__main__':
  main()
