"""Is a row's difference to the baseline real? Paired bootstrap resampling over test sentences
(translation), or Welch's t-test over seeds (a language model's one number per run).

`paired_bootstrap` is sacreBLEU's paired bootstrap test (`sacrebleu.significance`, the Moses
script's method: Koehn 2004) extended to several seeds per system: each resample draws the
same sentence indices for every output; a system's score on a resample is the mean over its
seeds of the corpus score of their resampled outputs (from sacreBLEU's own sufficient
statistics). With one seed a side it is sacreBLEU's test, resamples, interval and p-value (but for
exact ties: `paired_bootstrap`) (tests/experiments/test_sweep_significance.py checks it against
`sacrebleu.significance.PairedTest`).
The bootstrap measures the test set's sampling noise around the seed-averaged systems; the
seed spread is reported beside it, not folded in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

SEED = 12345  # sacreBLEU's default SACREBLEU_SEED: the same resamples as its own test
SAMPLES = 1000  # sacreBLEU's default for the bootstrap
LEVEL = 0.05  # significant when p < LEVEL and the 95% interval excludes 0


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A system against the baseline: `delta` (system - baseline, each the mean over its
  seeds), the 95% interval [low, high] of that difference, the p-value, and the verdict."""

  delta: float
  low: float
  high: float
  p_value: float
  method: str

  @property
  def significant(self) -> bool:
    """p < LEVEL and the 95% interval excludes 0. The bootstrap's p (the centred |difference|)
    and its percentile interval are two constructions, which can disagree near the edge."""
    return self.p_value < LEVEL and (self.low > 0 or self.high < 0)

  @property
  def verdict(self) -> str:
    if self.significant:
      return 'significant'
    return 'borderline' if self.p_value < LEVEL else 'not significant'  # p and interval differ


def _metric(name: str):
  import sacrebleu  # pylint: disable=import-outside-toplevel
  return {'bleu': lambda: sacrebleu.metrics.BLEU(),
          'bleu_lowercased': lambda: sacrebleu.metrics.BLEU(lowercase=True, tokenize='13a'),
          'chrf2': lambda: sacrebleu.metrics.CHRF()}[name]()


def _interval(values: np.ndarray) -> tuple[float, float]:
  """sacreBLEU's 95% bounds of bootstrap values (`estimate_ci`: the 1/40th from each end)."""
  values = np.sort(values)
  lower = len(values) // 40
  return float(values[lower]), float(values[len(values) - lower - 1])


def paired_bootstrap(baseline: Sequence[Sequence[str]], system: Sequence[Sequence[str]],
                     references: Sequence[str], *, metric: str = 'bleu',
                     samples: int = SAMPLES, seed: int = SEED) -> Comparison:
  """`baseline` and `system`: each a list of outputs (one per seed), each a hypothesis per
  reference line -> `Comparison` of the seed-averaged corpus scores."""
  n = len(references)
  for outputs in (baseline, system):
    if not outputs or any(len(o) != n for o in outputs):
      raise ValueError(f'every output must have one line per reference ({n})')
  scorer = _metric(metric)
  refs = [list(references)]
  indices = np.random.default_rng(seed).choice(n, size=(samples, n), replace=True)

  def seed_averaged(outputs) -> tuple[float, np.ndarray]:
    actual, resampled = [], []
    for hypotheses in outputs:
      stats = scorer._extract_corpus_statistics(list(hypotheses), refs)  # noqa: SLF001
      actual.append(scorer._aggregate_and_compute(stats).score)  # noqa: SLF001
      stats = np.array(stats, dtype='float32')
      resampled.append([scorer._compute_score_from_stats(s.sum(0)).score  # noqa: SLF001
                        for s in stats[indices]])
    return float(np.mean(actual)), np.mean(np.array(resampled), axis=0)

  base, base_samples = seed_averaged(baseline)
  sys_, sys_samples = seed_averaged(system)
  # sacreBLEU's p-value: how often a resample's |difference|, centred, reaches the real one.
  # It counts `>`, which calls two identical systems different (p = 1/(samples+1)); `>=`
  # counts the ties, which only identical outputs produce, and agrees elsewhere.
  spread = np.abs(sys_samples - base_samples)
  centred = spread - spread.mean()
  p_value = (int(np.sum(centred >= abs(sys_ - base))) + 1) / (samples + 1)
  low, high = _interval(sys_samples - base_samples)
  return Comparison(sys_ - base, low, high, p_value,
                    f'paired bootstrap, {samples} resamples of {n} sentences')


def welch(baseline: Sequence[float], system: Sequence[float]) -> Comparison | None:
  """Welch's t-test of two rows' per-seed values (a language model's validation loss): the
  difference of the means and its 95% interval. None with fewer than 2 seeds a side."""
  if len(baseline) < 2 or len(system) < 2:
    return None
  from scipy import stats  # pylint: disable=import-outside-toplevel
  a, b = np.asarray(baseline, float), np.asarray(system, float)
  delta = float(b.mean() - a.mean())
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  se = math.sqrt(va + vb)
  if se == 0:
    return Comparison(delta, delta, delta, 1.0 if delta == 0 else 0.0,
                      f'Welch t-test over {len(a)} and {len(b)} seeds')
  dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  half = float(stats.t.ppf(1 - LEVEL / 2, dof)) * se
  p_value = float(2 * stats.t.sf(abs(delta) / se, dof))
  return Comparison(delta, delta - half, delta + half, p_value,
                    f'Welch t-test over {len(a)} and {len(b)} seeds')
