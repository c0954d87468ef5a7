"""Time to quality (issue 76, item 3): the paper's preset (`configs/multi30k.py`) against the
best CPU-hour recipe measured so far (`MODERN_B64`, round 1's finalist; a round-2 preset that
beats it takes its place), 3 seeds, every 250-step checkpoint kept:

    python sweep.py --sweep=configs/sweeps/time_multi30k.py --root=runs/time_multi30k
    python bench/time_to_quality.py --output_dir=runs/time_multi30k/quality \
        --workdir=runs/time_multi30k/paper/seed_0 ... --workdir=runs/time_multi30k/modern_b64/seed_2

The runs go one at a time (the sweep's local executor) and seed by seed, on a quiet machine:
their minutes are the measurement. bench/time_to_quality.py then decodes validation with
each kept checkpoint (beam 6, length penalty 1.4, the presets' decoding) and gives the
minutes of training each run needs to reach 39 and 40 lowercased BLEU, evaluations left out.
The presets keep their last 10 checkpoints; here all of them (18 at most), so that a curve
starts at step 250. The sweep's own evaluation (decoding chosen on validation, test2016 read
once) is the finalists'. The row `paper_8000` is the paper's preset given the whole hour; its
runs were made from the `paper` row's by resuming each step-4,500 workdir (a copy, without its
`sweep_eval/`) with `python train.py --config=configs/multi30k.py --workdir=COPY
--config.train.max_checkpoints=18 --config.train.seed=S --config.train.num_steps=8000` and
placing it at ROOT/paper_8000/seed_S, where the sweep evaluates it (a fresh run of the row
trains the same steps from step 0).
"""

from configs.multi30k import MODERN_B64
from configs.sweeps import Sweep
from configs.sweeps.final_multi30k import get_sweep as finalists

# Every checkpoint of the longest run (4,500 steps, one each 250).
KEEP_EVERY_CHECKPOINT = {'train.max_checkpoints': 18}

# The paper's preset given the whole hour. Its schedule (warmup, then inverse square root)
# does not depend on the number of steps: the `paper` runs are this row's first 4,500 steps.
PAPER_TO_THE_HOUR = {'train.num_steps': 8000}


def get_sweep():
  final = finalists()
  return Sweep(
      config=final.config,
      overrides=KEEP_EVERY_CHECKPOINT,
      rows={'paper': {}, 'modern_b64': MODERN_B64, 'paper_8000': PAPER_TO_THE_HOUR},
      baseline='paper',
      seeds=3,
      order='seed',
      decode=final.decode,
      description='Time to quality: the paper\'s preset against the best CPU-hour recipe, '
                  'every checkpoint kept, one run at a time on a quiet machine.')
