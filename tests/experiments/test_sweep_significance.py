"""The sweep table's verdicts: `significance.paired_bootstrap` against sacreBLEU's own paired
bootstrap on fixed hypothesis files, and Welch's t-test over seeds."""

import gzip
import os
import random

import pytest
import sacrebleu
from sacrebleu.significance import PairedTest
from scipy import stats

from experiments import significance
from tests import REPO

TEST2016_DE = os.path.join(REPO, 'data', 'multi30k', 'test_2016_flickr.de.gz')


def _degraded(lines, drop: float, seed: int) -> list[str]:
  """Each reference with a share `drop` of its words left out: a worse system the more."""
  rng = random.Random(seed)
  return [' '.join(w for w in line.split() if rng.random() >= drop) for line in lines]


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  """References (test2016's German side, first 400 lines) and three systems, as files."""
  with gzip.open(TEST2016_DE, 'rt', encoding='utf-8') as f:
    refs = f.read().split('\n')[:400]
  systems = {'refs': refs, 'weak': _degraded(refs, 0.3, 1), 'strong': _degraded(refs, 0.1, 2),
             'weak_again': _degraded(refs, 0.3, 3)}
  directory = tmp_path_factory.mktemp('systems')
  paths = {}
  for name, lines in systems.items():
    paths[name] = directory / f'{name}.txt'
    paths[name].write_text('\n'.join(lines) + '\n', encoding='utf-8')
  return {name: path.read_text(encoding='utf-8').split('\n')[:-1]
          for name, path in paths.items()}


def _sacrebleu(baseline, system, refs, metric):
  _, scores = PairedTest([('baseline', baseline), ('system', system)], {'m': metric}, [refs],
                         test_type='bs', n_samples=significance.SAMPLES)()
  (name,) = [k for k in scores if k != 'System']
  base, result = scores[name]
  return result.score - base.score, result.p_value


@pytest.mark.parametrize('metric, make', [('bleu', sacrebleu.metrics.BLEU),
                                          ('chrf2', sacrebleu.metrics.CHRF)])
@pytest.mark.parametrize('system', ['strong', 'weak_again'])
def test_one_seed_is_sacrebleus_paired_bootstrap(files, metric, make, system):
  ours = significance.paired_bootstrap([files['weak']], [files[system]], files['refs'],
                                       metric=metric)
  delta, p_value = _sacrebleu(files['weak'], files[system], files['refs'], make())
  assert ours.delta == pytest.approx(delta, abs=1e-9)
  assert ours.p_value == pytest.approx(p_value, abs=1e-12)
  assert ours.low <= ours.delta <= ours.high


def test_verdicts(files):
  same = significance.paired_bootstrap([files['weak']], [files['weak']], files['refs'])
  assert (same.delta, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
  assert not same.significant
  better = significance.paired_bootstrap([files['weak']], [files['strong']], files['refs'])
  assert better.significant and better.delta > 10 and better.low > 0
  # Two draws of the same degradation: their difference is noise.
  noise = significance.paired_bootstrap([files['weak']], [files['weak_again']], files['refs'])
  assert not noise.significant and noise.low < 0 < noise.high
  assert (same.verdict, better.verdict, noise.verdict) == (
      'not significant', 'significant', 'not significant')
  # sacreBLEU's p and its percentile interval may disagree near the edge (a screen's z-loss
  # row: p 0.034, [-1.34, +0.20]): p alone is not a finding.
  edge = significance.Comparison(-0.65, -1.34, 0.20, 0.034, 'paired bootstrap')
  assert not edge.significant and edge.verdict == 'borderline'


def test_seeds_are_averaged(files):
  """Several outputs a side: the difference of the seed means of the corpus scores; the same
  output twice is that output once."""
  refs = files['refs']
  bleu = lambda hyps: sacrebleu.corpus_bleu(hyps, [refs]).score  # noqa: E731
  two = significance.paired_bootstrap([files['weak'], files['weak_again']], [files['strong']],
                                      refs)
  expected = bleu(files['strong']) - (bleu(files['weak']) + bleu(files['weak_again'])) / 2
  assert two.delta == pytest.approx(expected, abs=1e-9)
  once = significance.paired_bootstrap([files['weak']], [files['strong']], refs)
  twice = significance.paired_bootstrap([files['weak']] * 2, [files['strong']] * 2, refs)
  assert (twice.delta, twice.low, twice.high, twice.p_value) == pytest.approx(
      (once.delta, once.low, once.high, once.p_value))
  with pytest.raises(ValueError, match='one line per reference'):
    significance.paired_bootstrap([files['weak'][:-1]], [files['strong']], refs)


def test_welch_over_seeds():
  base, system = [1.80, 1.82, 1.79], [1.70, 1.73, 1.69]
  c = significance.welch(base, system)
  assert c.delta == pytest.approx(sum(system) / 3 - sum(base) / 3)
  assert c.p_value == pytest.approx(stats.ttest_ind(system, base, equal_var=False).pvalue)
  assert c.significant and c.high < 0
  assert not significance.welch(base, [1.81, 1.78, 1.83]).significant
  assert significance.welch([1.8], system) is None  # one seed: no spread to test against
