"""A sweep's table and curves: `ROOT/summary.md` and `ROOT/curves.png`.

One line per row: the sweep's metric as mean ± standard deviation over the finished seeds,
min and max, then the difference to the baseline row (or, in a ladder, to the row before it)
with its 95% interval, p-value and verdict, then the other scores, the parameters, the
median step time and the time per run. A translation's verdict
is the paired bootstrap over test sentences of the seed-averaged outputs
(`significance.paired_bootstrap`); a language model's is Welch's t-test over the seeds. A
partly finished sweep reports what it has and marks the rest.
"""

from __future__ import annotations

import dataclasses
import io
import os
import statistics
import time
from typing import Any

from experiments import evaluate, significance
from experiments.runs import check_runs, evaluated, write_file
from experiments.sweep_file import Plan, Run

SUMMARY, CURVES = 'summary.md', 'curves.png'
NAMES = {'bleu': 'BLEU', 'bleu_lowercased': 'lowercased tok. BLEU', 'chrf2': 'chrF2',
         'loss': 'validation loss'}


@dataclasses.dataclass
class RowResults:
  """The finished runs of one row: their results.json and (translation) test outputs."""

  name: str
  planned: list[Run]
  finished: list[Run]  # those of `results`, in the same order
  results: list[dict[str, Any]]
  test_outputs: list[list[str]]
  references: list[str] | None

  @property
  def seeds(self) -> int:
    return len(self.results)

  def values(self, metric: str, split: str = 'test') -> list[float]:
    return [r[split][metric] for r in self.results if metric in r.get(split, {})]


def collect(plan: Plan) -> list[RowResults]:
  """The runs each row counts: those the plan counts done (`evaluated`: its last step,
  this sweep's evaluation setting, its outputs whole). Refuses (`SweepError`, one line) a
  root where a run was trained with another config than its row's (`check_runs`)."""
  check_runs(plan)  # SweepError: a run of another config is never merged into a row
  rows = []
  for name in plan.rows:
    planned = [r for r in plan.runs if r.row == name]
    finished, results, outputs, references = [], [], [], None
    for run in planned:
      found = evaluated(plan, run)
      if found is None:
        continue
      if run.translates:
        hyps, refs = (evaluate.read_lines(evaluate.split_file(run.workdir, 'test', what))
                      for what in ('hyp', 'ref'))
        if hyps is None or refs is None:
          continue
        references = references or refs
        outputs.append(hyps)
      finished.append(run)
      results.append(found)
    rows.append(RowResults(name, planned, finished, results, outputs, references))
  return rows


def metric_of(plan: Plan) -> str:
  return plan.sweep.metric if plan.runs and plan.runs[0].translates else 'loss'


def _mean_sd(values: list[float], digits: int) -> str:
  if not values:
    return '-'
  if len(values) == 1:
    return f'{values[0]:.{digits}f}'
  return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def _range(values: list[float], digits: int) -> str:
  return f'{min(values):.{digits}f}–{max(values):.{digits}f}' if values else '-'


def compare(plan: Plan, rows: list[RowResults]) -> dict[str, significance.Comparison | None]:
  """Each row against its reference row (`Plan.reference`: the baseline, or the row before it)
  (None: the baseline itself, or not enough finished runs to compare)."""
  metric = metric_of(plan)
  by_name = {r.name: r for r in rows}
  out: dict[str, significance.Comparison | None] = {}
  for row in rows:
    reference = plan.reference(row.name)
    base = by_name[reference] if reference is not None else None
    if base is None or not row.results or not base.results:
      out[row.name] = None
    elif metric == 'loss':
      out[row.name] = significance.welch(base.values('loss', 'validation'),
                                         row.values('loss', 'validation'))
    elif row.references != base.references:
      out[row.name] = None  # another test set: nothing to pair
    else:
      out[row.name] = significance.paired_bootstrap(base.test_outputs, row.test_outputs,
                                                    base.references, metric=metric)
  return out


def _events(run: Run):
  """The run's TensorBoard scalars (`experiments.report.Run`), or None before it has any."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  try:
    return report.load_run(run.workdir)
  except (FileNotFoundError, OSError):
    return None


def _step_ms(run: Run) -> float | None:
  from experiments import report  # pylint: disable=import-outside-toplevel
  return report.median_step_ms(run.workdir)


def _minutes(run: Run) -> float | None:
  events = _events(run)
  return None if events is None else events.minutes


def _final_loss(run: Run) -> float | None:
  """The trainer's last validation loss (teacher-forced: a figure with little seed noise)."""
  events = _events(run)
  points = [] if events is None else events.scalars.get('eval/loss', [])
  return points[-1].value if points and points[-1].step == run.num_steps else None


def markdown(plan: Plan, rows: list[RowResults]) -> str:
  metric = metric_of(plan)
  translation = metric != 'loss'
  split = 'test' if translation else 'validation'
  digits = 2 if translation else 4
  comparisons = compare(plan, rows)
  against = 'previous row' if plan.sweep.compare == 'previous' else plan.baseline
  header = ['row', 'seeds', f'test {NAMES[metric]}' if translation else NAMES[metric], 'min–max',
            f'Δ vs {against} [95% interval]', 'p', 'verdict']
  others = [m for m in evaluate.METRICS if m != metric] if translation else []
  header += [f'test {NAMES[m]}' for m in others]
  header += ['valid BLEU', 'valid loss'] if translation else []
  header += ['parameters', 'ms/step', 'train min/run', 'eval min/run']
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for row in rows:
    values = row.values(metric, split)
    c = comparisons[row.name]
    if plan.reference(row.name) is None:
      delta, p, verdict = 'baseline', '', ''
    elif c is None:
      delta, p, verdict = '-', '-', 'too few runs' if row.results else '-'
    else:
      delta = f'{c.delta:+.{digits}f} [{c.low:+.{digits}f}, {c.high:+.{digits}f}]'
      p, verdict = f'{c.p_value:.3f}', c.verdict
    seeds = f'{row.seeds}/{len(row.planned)}' + ('' if row.seeds == len(row.planned)
                                                 else ' (unfinished)')
    cells = [row.name, seeds, _mean_sd(values, digits), _range(values, digits), delta, p,
             verdict]
    cells += [_mean_sd(row.values(m), 2) for m in others]
    if translation:
      losses = [x for x in (_final_loss(r) for r in row.planned) if x is not None]
      cells += [_mean_sd(row.values('bleu', 'validation'), 2), _mean_sd(losses, 3)]
    params = {r.get('parameters') for r in row.results} - {None}
    # Training minutes of the finished runs only (a run stopped early would pull the mean down).
    minutes = [m for m in (_minutes(r) for r in row.finished) if m is not None]
    evals = [r['eval_wall_s'] / 60 for r in row.results if 'eval_wall_s' in r]
    step_ms = [m for m in (_step_ms(r) for r in row.planned) if m is not None]
    cells += [f'{params.pop():,}' if len(params) == 1 else '-',
              f'{statistics.mean(step_ms):.0f}' if step_ms else '-',
              f'{statistics.mean(minutes):.1f}' if minutes else '-',
              f'{statistics.mean(evals):.1f}' if evals else '-']
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(_preamble(plan, rows, translation) + [''] + lines) + '\n' + _notes(
      plan, translation)


def _preamble(plan: Plan, rows: list[RowResults], translation: bool) -> list[str]:
  sweep = plan.sweep
  finished = sum(r.seeds for r in rows)
  name = os.path.splitext(os.path.basename(plan.path))[0] or plan.root
  out = [f'# Sweep {name}: {plan.root}', '']
  if sweep.description:
    out += [sweep.description, '']
  out += [f'- sweep file: `{plan.path}`; config `{sweep.config}`'
          + (f' with {dict(sweep.overrides)}' if sweep.overrides else ''),
          '- rows: ' + '; '.join(_row_overrides(plan, name) for name in plan.rows),
          f'- {finished} of {len(plan.runs)} runs finished; written '
          f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}',
          '- each run counted was checked: its config.json is its row\'s resolved config, field '
          'by field (its seed included), and its results.json is of its last step'
          + (', from the evaluation below, beside whole outputs' if translation else '')]
  if translation:
    first = next((r.results[0] for r in rows if r.results), {})
    search = first.get('search', '?')
    average = first.get('decode', {}).get(evaluate.AVERAGE_LAST, 1)
    cap = sweep.eval_sentences
    splits = f'the first {cap} sentences of' if cap else 'the whole'
    averaged = ('no checkpoint averaging' if average == 1 else
                f'the last {average} checkpoints averaged')
    if evaluate.is_grid(sweep.decode):
      out.append(f'- evaluation: {splits} validation and test splits; each run\'s decoding '
                 f'chosen on its validation {NAMES[sweep.metric]} from the sweep\'s '
                 f'decode={dict(sweep.decode)}, then test decoded once with it; BLEU '
                 f'`{first.get("test", {}).get("bleu_signature")}`')
      listed = [k for k, v in sweep.decode.items() if isinstance(v, (list, tuple))]
      out.append('- chosen: ' + '; '.join(
          f'{row.name} ' + ', '.join(
              '/'.join(str(r['decode'].get(k)) for k in listed) for r in row.results)
          for row in rows if row.results) + f' ({"/".join(listed)}, per seed)')
    else:
      out.append(f'- evaluation: {splits} validation and test splits, {search}, {averaged} '
                 f'(the sweep\'s decode={dict(sweep.decode)}, else the config\'s decode '
                 f'section); BLEU `{first.get("test", {}).get("bleu_signature")}`')
  return out


def _row_overrides(plan: Plan, name: str) -> str:
  """A row's overrides, as what it changes in the row it is compared with when that is
  shorter (a screen's rows repeat the preset's fields: each row then reads as its one option)."""
  overrides = dict(plan.row_overrides[name])
  whole = f'`{name}` {overrides or "(the config as is)"}'
  reference = plan.reference(name)
  if reference is None:
    return whole
  theirs = dict(plan.row_overrides[reference])
  changed = {k: v for k, v in overrides.items() if k not in theirs or theirs[k] != v}
  dropped = [k for k in theirs if k not in overrides]
  relative = ' '.join([f'`{name}` = `{reference}`', *([f'+ {changed}'] if changed else []),
                       *([f'less {dropped}'] if dropped else [])])
  return relative if len(relative) < len(whole) else whole


def _notes(plan: Plan, translation: bool) -> str:
  reference = 'previous row' if plan.sweep.compare == 'previous' else 'baseline'
  if translation:
    return (f'\nmean ± sd over seeds. Δ: the row\'s seed-averaged test score minus the '
            f'{reference}\'s; interval and p from a paired bootstrap over test sentences '
            f'({significance.SAMPLES} resamples, sacreBLEU\'s method and seed) of the '
            f'seed-averaged outputs; "significant" at p < {significance.LEVEL} with an interval '
            f'that excludes 0 ("borderline": p < {significance.LEVEL}, the interval spans 0; '
            f'the two are sacreBLEU\'s p and its percentile interval). The bootstrap '
            f'measures the test set\'s sampling noise; compare the seed sd beside it: a Δ '
            f'within the seed spread is not a finding, whatever p says. valid loss: the '
            f'trainer\'s teacher-forced validation loss at the last step (per token). '
            f'ms/step: the median training step (train.py\'s log; a figure of a quiet machine '
            f'only where the sweep ran alone).\n')
  return (f'\nmean ± sd over seeds. Δ: the row\'s mean minus the {reference}\'s, with the 95% '
          f'interval and p of Welch\'s t-test over seeds; "significant" at p < '
          f'{significance.LEVEL}.\n')


# ------------------------------------------------------------------------------ curves

PANELS = (('train/loss', 'train loss'), ('eval/loss', 'validation loss'),
          ('eval/bleu', 'validation BLEU (num_eval_sentences)'))


def plot(plan: Plan, path: str) -> str | None:
  """One colour per row: thin lines per seed, a thick line for the row mean (at the steps
  every seed has). None when no run has events yet."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  runs: dict[str, list] = {}
  for run in plan.runs:
    try:
      runs.setdefault(run.row, []).append(report.load_run(run.workdir, run.name))
    except (FileNotFoundError, OSError):
      continue
  panels = [(tag, title) for tag, title in PANELS
            if any(r.scalars.get(tag) for rs in runs.values() for r in rs)]
  if not panels:
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
  colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for ax, (tag, title) in zip(axes[0], panels, strict=True):
    for i, row in enumerate(plan.rows):
      colour = colours[i % len(colours)]
      series = [{p.step: p.value for p in r.scalars.get(tag, [])} for r in runs.get(row, [])]
      series = [s for s in series if s]
      for s in series:
        ax.plot(list(s), list(s.values()), color=colour, linewidth=0.7, alpha=0.35,
                marker='o' if len(s) < 20 else None, markersize=2)
      common = sorted(set.intersection(*(set(s) for s in series))) if series else []
      if common:
        label = f'{row} ({len(series)} seed{"s" * (len(series) > 1)})'
        ax.plot(common, [statistics.mean(s[k] for s in series) for k in common], color=colour,
                linewidth=2, marker='o' if len(common) < 20 else None, markersize=4,
                label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel('step', fontsize=9)
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=110)
  plt.close(fig)
  write_file(path, png.getvalue())
  return path


def write(plan: Plan) -> dict[str, str | None]:
  """Writes ROOT/summary.md (also returned as 'table') and ROOT/curves.png. Refuses
  (`SweepError`) a root whose runs were not trained with their rows' configs
  (`check_runs`); a full disk is one `SweepError` line (exit status 1)."""
  text = markdown(plan, collect(plan))
  summary = os.path.join(plan.root, SUMMARY)
  write_file(summary, text.encode())
  return {'summary': summary, 'curves': plot(plan, os.path.join(plan.root, CURVES)),
          'table': text}
