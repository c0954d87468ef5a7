"""Time to quality: validation BLEU against minutes of training, from every checkpoint a run
kept, and the minutes each run needs to reach given BLEU (issue 76, item 3).

    python bench/time_to_quality.py --output_dir=DIR \
        --workdir=runs/ttq/paper/seed_0 --workdir=runs/ttq/paper/seed_1 \
        --workdir=runs/ttq/modern_b64/seed_0 ... [--thresholds=39,40] \
        [--beam_size=6 --alpha=1.4] [--average_last=1] [--sentences=N]

A run's minutes at a checkpoint are its own wall time at that step (the event files, read as
`experiments.report` reads them: a resumed run's sessions joined without the pause between
them) less the seconds its validation evaluations and checkpoint saves took before that step:
the time a run that never stopped to evaluate would have taken. Each kept checkpoint (or the
average of the last `--average_last` up to it) decodes the run's validation split with the
given search, scored as the sweeps score it (`experiments.evaluate.scores`: lowercased and cased
BLEU). For a time to count, the runs train one at a time on a quiet machine: the checkpoint
interval is the curve's resolution, and a run keeps its last `train.max_checkpoints` only (the
crossing of a threshold before the first kept one is reported as "by" that checkpoint).

A run's recipe is its row: ROOT/ROW/seed_K of a sweep (else the workdir's name, or
`--names`). Writes DIR/time_to_quality.json (every point, and per recipe and threshold each
run's minutes) and DIR/time_to_quality.png (BLEU against minutes, each run a thin line, one
colour per recipe, the thresholds dashed), and prints the table.

Checkpoints are not archived (a sweep's archive keeps the events and outputs only), so a run's
points are decoded on the machine that trained it, right after it, and kept; `--merge=JSON`
(repeatable) joins the runs of earlier invocations' time_to_quality.json, decoded with the same
settings, to this one's (`--workdir` may then be left out):

    python bench/time_to_quality.py --workdir=runs/ttq/paper/seed_0 --output_dir=Q0
    python bench/time_to_quality.py --merge=Q0/time_to_quality.json \
        --merge=Q1/time_to_quality.json ... --output_dir=DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What the minutes leave out: the evaluations and the checkpoint saves before a step.
PAUSES = ('eval/seconds', 'checkpoint/seconds')
METRICS = ('bleu_lowercased', 'bleu')  # the sweeps' lowercased BLEU first: the thresholds' metric


def recipe_of(workdir: str) -> str:
  """ROOT/ROW/seed_K -> ROW; any other workdir -> its name."""
  path = os.path.normpath(workdir)
  name = os.path.basename(path)
  return os.path.basename(os.path.dirname(path)) if re.fullmatch(r'seed_\d+', name) else name


def training_minutes(scalars: dict, step: int) -> float:
  """The run's minutes of training at `step` (`experiments.report.Run.scalars`): its wall time
  at the step's training log, interpolated between logs, less the `PAUSES` before it."""
  log = scalars.get('train/step_ms') or scalars.get('train/loss') or []
  if not log or step < log[0].step:
    raise ValueError(f'no training log at or before step {step}')
  before = [p for p in log if p.step <= step][-1]
  after = next((p for p in log if p.step >= step), before)
  minutes = before.minutes
  if after.step > before.step:
    minutes += (after.minutes - before.minutes) * (step - before.step) / (after.step - before.step)
  paused = sum(p.value for tag in PAUSES for p in scalars.get(tag, []) if p.step < step)
  return minutes - paused / 60


def crossing(points: Sequence[tuple[float, float]], threshold: float) -> dict:
  """When a run's (minutes, BLEU) points, in time order, first reach `threshold`: between the
  last point below it and the first at or above it, linearly -> {'minutes', 'how'}: how is
  'interpolated', 'by' (already there at the first point: at most its minutes) or 'never'."""
  for i, (minutes, value) in enumerate(points):
    if value >= threshold:
      if i == 0:
        return {'minutes': round(minutes, 2), 'how': 'by'}
      m0, v0 = points[i - 1]
      return {'minutes': round(m0 + (minutes - m0) * (threshold - v0) / (value - v0), 2),
              'how': 'interpolated'}
  return {'minutes': None, 'how': 'never'}


def run_points(workdir: str, decode: dict, average_last: int, sentences: int | None,
               log=print) -> list[dict]:
  """[{'step', 'minutes', 'bleu_lowercased', 'bleu', 'chrf2'}]: each checkpoint `workdir`
  kept."""
  import inference  # pylint: disable=import-outside-toplevel
  from experiments import evaluate, report  # pylint: disable=import-outside-toplevel
  from input_pipeline import sources  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  from workdir.config_io import load_config  # pylint: disable=import-outside-toplevel
  scalars = report.load_run(workdir).scalars
  data = load_config(workdir).data
  examples = sources.split_texts(data, data.eval_split)[:sentences]
  steps = checkpoint.list_steps(workdir)
  if not steps:
    raise ValueError(f'{workdir}: no checkpoint')
  points = []
  for i, step in enumerate(steps):
    session = inference.load(workdir, step=step, average_last=min(average_last, i + 1),
                             warn=lambda message: None)
    scores = evaluate._decode_split(session, decode, examples)  # the sweeps' decode and scores
    points.append({'step': step, 'minutes': round(training_minutes(scalars, step), 3),
                   **{name: scores[name] for name in (*METRICS, 'chrf2')}})
    log(f'{workdir} step {step}: {points[-1]["minutes"]:.1f} min, BLEU (lowercased) '
        f'{points[-1]["bleu_lowercased"]:.2f}')
  return points


# What must agree for two invocations' points to be one measurement.
SETTINGS = ('decode', 'average_last', 'sentences')


def merged(paths: Sequence[str], settings: dict) -> dict[str, dict]:
  """The runs of earlier invocations' time_to_quality.json files -> {workdir: run}; ValueError
  naming the file when one cannot be read, was decoded with other `settings`, or repeats a
  run."""
  runs: dict[str, dict] = {}
  for path in paths:
    try:
      with open(path, encoding='utf-8') as f:
        found = json.load(f)
      theirs = {name: found[name] for name in SETTINGS}
      their_runs = found['runs']
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f'--merge={path}: not a time_to_quality.json '
                       f'({type(e).__name__}: {e})') from None
    for name in SETTINGS:
      if theirs[name] != settings[name]:
        raise ValueError(f'--merge={path}: decoded with {name}={theirs[name]!r}, this run '
                         f'asks {settings[name]!r}')
    for workdir, run in their_runs.items():
      if workdir in runs:
        raise ValueError(f'--merge={path}: run {workdir} is already in another file')
      runs[workdir] = run
  return runs


def summarize(runs: dict[str, dict], thresholds: Sequence[float]) -> dict:
  """recipe -> threshold -> {'runs': [each run's crossing], 'mean_minutes' (None unless every
  run's crossing is interpolated), 'sd_minutes'}."""
  out: dict[str, dict] = {}
  for run in runs.values():
    recipe = out.setdefault(run['recipe'], {})
    points = [(p['minutes'], p[METRICS[0]]) for p in run['points']]
    for threshold in thresholds:
      recipe.setdefault(str(threshold), {'runs': []})['runs'].append(crossing(points, threshold))
  for recipe in out.values():
    for found in recipe.values():
      minutes = [c['minutes'] for c in found['runs'] if c['how'] == 'interpolated']
      whole = len(minutes) == len(found['runs'])
      found['mean_minutes'] = round(statistics.fmean(minutes), 2) if whole else None
      found['sd_minutes'] = (round(statistics.stdev(minutes), 2) if whole and len(minutes) > 1
                             else None)
  return out


def table(summary: dict, thresholds: Sequence[float]) -> str:
  """Markdown: a row per recipe, a column per threshold (mean ± sd over runs, or each run's)."""
  def cell(found: dict) -> str:
    if found['mean_minutes'] is not None:
      spread = f' ± {found["sd_minutes"]:.1f}' if found['sd_minutes'] is not None else ''
      return f'{found["mean_minutes"]:.1f}{spread} ({len(found["runs"])} runs)'
    return ', '.join('never' if c['how'] == 'never' else
                     f'{"by " if c["how"] == "by" else ""}{c["minutes"]:.1f}'
                     for c in found['runs'])
  head = '| recipe | ' + ' | '.join(f'minutes to {t} BLEU' for t in thresholds) + ' |'
  rows = [f'| {recipe} | ' + ' | '.join(cell(found[str(t)]) for t in thresholds) + ' |'
          for recipe, found in summary.items()]
  return '\n'.join([head, '|---|' + '---:|' * len(thresholds), *rows]) + '\n'


def plot(runs: dict[str, dict], thresholds: Sequence[float], path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  recipes = sorted({run['recipe'] for run in runs.values()})
  colours = {r: plt.get_cmap('tab10')(i % 10) for i, r in enumerate(recipes)}
  fig, ax = plt.subplots(figsize=(7, 4.2))
  labelled = set()
  for run in runs.values():
    points = run['points']
    ax.plot([p['minutes'] for p in points], [p[METRICS[0]] for p in points], lw=0.9, alpha=0.7,
            marker='o', markersize=2.5, color=colours[run['recipe']],
            label=None if run['recipe'] in labelled else run['recipe'])
    labelled.add(run['recipe'])
  for threshold in thresholds:
    ax.axhline(threshold, ls='--', lw=0.7, color='grey')
  ax.set_xlabel('minutes of training (evaluations and checkpoint saves left out)')
  ax.set_ylabel('validation BLEU (lowercased)')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', action='append', default=[], help='a run (repeatable)')
  parser.add_argument('--merge', action='append', default=[],
                      help="an earlier invocation's time_to_quality.json whose runs join these "
                      '(repeatable; the same decoding settings)')
  parser.add_argument('--names', default=None, help='comma-separated recipe of each workdir '
                      '(default: the sweep row, ROOT/ROW/seed_K)')
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--thresholds', default='39,40', help='validation BLEU (lowercased)')
  parser.add_argument('--beam_size', type=int, default=6)
  parser.add_argument('--alpha', type=float, default=1.4)
  parser.add_argument('--max_new_tokens', type=int, default=None)
  parser.add_argument('--average_last', type=int, default=1,
                      help='checkpoints averaged up to each one (fewer at the first ones)')
  parser.add_argument('--sentences', type=int, default=None,
                      help='the first N validation sentences (default: all)')
  args = parser.parse_args(argv)
  try:
    thresholds = [float(t) for t in args.thresholds.split(',')]
  except ValueError:
    parser.error(f'--thresholds={args.thresholds!r}: numbers separated by commas')
  if not args.workdir and not args.merge:
    parser.error('give at least one --workdir or --merge')
  names = args.names.split(',') if args.names else [recipe_of(w) for w in args.workdir]
  if len(names) != len(args.workdir):
    parser.error(f'--names has {len(names)} names for {len(args.workdir)} workdirs')
  if args.average_last < 1 or (args.sentences is not None and args.sentences < 1):
    parser.error('--average_last and --sentences must be at least 1')
  for workdir in args.workdir:
    if not os.path.isdir(workdir):
      parser.error(f'--workdir={workdir} is not a directory')
  # Checked before the decoding, which may take an hour; made only once there is a result.
  from common.files import nearest_existing  # pylint: disable=import-outside-toplevel
  existing = nearest_existing(args.output_dir)
  if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
    parser.error(f'--output_dir={args.output_dir}: {existing} is not a directory this process '
                 'can write in')
  decode = {'beam_size': args.beam_size, 'alpha': args.alpha}
  if args.max_new_tokens is not None:
    decode['max_new_tokens'] = args.max_new_tokens
  if args.beam_size == 1:
    decode.pop('alpha')
  settings = {'decode': decode, 'average_last': args.average_last, 'sentences': args.sentences}
  try:
    runs = merged(args.merge, settings)
  except ValueError as e:
    parser.error(str(e))
  for workdir in args.workdir:
    if workdir in runs:
      parser.error(f'--workdir={workdir} is already in a --merge file')
  for workdir, name in zip(args.workdir, names, strict=True):
    try:
      points = run_points(workdir, decode, args.average_last, args.sentences)
    except (OSError, ValueError, RuntimeError) as e:  # not a run, no checkpoint, no events
      print(f'time_to_quality.py: error: --workdir={workdir}: {e}', file=sys.stderr)
      raise SystemExit(2) from None
    runs[workdir] = {'recipe': name, 'points': points}
  summary = summarize(runs, thresholds)
  found = {'command': ' '.join(['python', 'bench/time_to_quality.py',
                                *(argv if argv is not None else sys.argv[1:])]),
           **settings, 'thresholds': thresholds, 'runs': runs, 'summary': summary}
  os.makedirs(args.output_dir, exist_ok=True)
  with open(os.path.join(args.output_dir, 'time_to_quality.json'), 'w', encoding='utf-8') as f:
    json.dump(found, f, indent=1)
  plot(runs, thresholds, os.path.join(args.output_dir, 'time_to_quality.png'))
  print(table(summary, thresholds), end='')
  return found


if __name__ == '__main__':
  main()
