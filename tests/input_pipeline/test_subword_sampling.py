"""Subword regularisation from our own random numbers (input_pipeline/subword_sampling.py):
the deterministic paths are sentencepiece's encoding, the samplers' distributions are the
definitions, and a seed gives the same segmentations in every process."""

import collections
import gzip
import itertools
import json
import math
import os
import random
import subprocess
import sys

import pytest
import sentencepiece as spm

from input_pipeline import subword_sampling, tokenizers
from tests import REPO

# Beside real German: runs of spaces, a tab, a no-break space, characters outside the
# vocabulary (byte fallback) and the empty text.
ODD = ['  Ein  Mann\tim  Park.', 'ẞ\u00a0x 😀 ☃☃', '', ' ', '<unk></s>']


@pytest.fixture(scope='module')
def texts():
  path = os.path.join(REPO, 'data', 'multi30k', 'train.de.gz')
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return [line.rstrip('\n') for line in itertools.islice(f, 1500)]


@pytest.fixture(scope='module', params=['bpe', 'unigram'])
def model(request, texts):
  tok = tokenizers.train_sentencepiece(texts, 600, model_type=request.param)
  return tok, spm.SentencePieceProcessor(model_proto=tok.model_proto), \
      subword_sampling.Sampler(tok.model_proto)


def test_the_deterministic_path_is_sentencepieces_encoding(model, texts):
  """BPE with alpha 0 and the unigram lattice's best path give sentencepiece's own ids,
  byte fallback and whitespace included."""
  _, sp, sampler = model
  for text in texts + ODD:
    got = sampler.sample(sp.normalize(text), random.Random(0), 0.0, 1)
    assert got == sp.encode(text), text


def test_samples_decode_to_the_text_and_a_seed_decides_them(model, texts):
  tok, sp, _ = model
  sample = tok.sample_batch(texts[:200] + ODD, alpha=0.3, nbest_size=-1, seed=7)
  assert [sp.decode(ids[:-1]) for ids in sample] == texts[:200] + ODD
  assert all(ids[-1] == tokenizers.EOS_ID for ids in sample)
  assert sample == tok.sample_batch(texts[:200] + ODD, alpha=0.3, nbest_size=-1, seed=7)
  other = tok.sample_batch(texts[:200] + ODD, alpha=0.3, nbest_size=-1, seed=8)
  assert other != sample
  plain = tok.encode_batch(texts[:200])
  assert sum(map(len, sample[:200])) > sum(map(len, plain))  # finer on average


def test_the_same_seed_gives_the_same_segmentations_in_another_process(model, texts):
  """sentencepiece's own sampler fails this (its seed does not carry across processes)."""
  tok, _, _ = model
  here = tok.sample_batch(texts[:50], alpha=0.2, nbest_size=-1, seed=11)
  script = ('import json, sys\nfrom input_pipeline import tokenizers\n'
            'tok = tokenizers.SentencePieceTokenizer(bytes.fromhex(sys.argv[1]))\n'
            'texts = json.loads(sys.stdin.read())\n'
            'print(json.dumps(tok.sample_batch(texts, alpha=0.2, nbest_size=-1, seed=11)))')
  out = subprocess.run([sys.executable, '-c', script, tok.model_proto.hex()], cwd=REPO,
                       input=json.dumps(texts[:50]), capture_output=True, text=True, check=True)
  assert json.loads(out.stdout) == here


def _segmentations(ends, pos):
  """Every path of the lattice reaching `pos`: [(score, pieces)]."""
  if pos == 0:
    return [(0.0, [])]
  return [(score + s, pieces + [piece]) for begin, piece, s in ends[pos]
          for score, pieces in _segmentations(ends, begin)]


def _total_variation(counts, probs, n):
  return 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in probs.items())


def test_unigram_sampling_draws_each_segmentation_with_its_probability(texts):
  """Kudo (2018): P(x) proportional to exp(alpha * score(x)) over every segmentation
  (nbest -1), or over the n best (nbest n) -- checked against the enumeration."""
  tok = tokenizers.train_sentencepiece(texts, 600, model_type='unigram')
  sp = spm.SentencePieceProcessor(model_proto=tok.model_proto)
  sampler = subword_sampling.Sampler(tok.model_proto)
  text = sp.normalize('Hunde spielen')
  ends = sampler._lattice(text)  # pylint: disable=protected-access
  paths = _segmentations(ends, len(text))
  assert 20 < len(paths) < 5000
  rng, n = random.Random(0), 4000
  for alpha, nbest in ((0.2, -1), (1.0, -1), (0.5, 4)):
    pool = sorted(paths, key=lambda p: -p[0])[:nbest] if nbest > 0 else paths
    z = sum(math.exp(alpha * s) for s, _ in pool)
    probs = {tuple(p): math.exp(alpha * s) / z for s, p in pool}
    counts = collections.Counter(tuple(sampler._unigram(text, rng, alpha, nbest))  # pylint: disable=protected-access
                                 for _ in range(n))
    assert set(counts) <= set(probs)
    assert _total_variation(counts, probs, n) < 0.05, (alpha, nbest)
  # The n best are sentencepiece's n best.
  best = subword_sampling._nbest(ends, 4)  # pylint: disable=protected-access
  assert [sampler._to_ids(p) for _, p in best] == sp.nbest_encode_as_ids('Hunde spielen', 4)  # pylint: disable=protected-access


def test_bpe_dropout_skips_each_merge_with_probability_alpha(texts):
  """Provilkov et al. (2020): a word two symbols long stays split with probability alpha;
  alpha 1 leaves every character apart (bytes where a character is no piece)."""
  tok = tokenizers.train_sentencepiece(texts, 600, model_type='bpe')
  sp = spm.SentencePieceProcessor(model_proto=tok.model_proto)
  sampler = subword_sampling.Sampler(tok.model_proto)
  pair = next(p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
              if len(p) == 2 and p in sampler.scores and p[0] != p[1])
  rng, n = random.Random(0), 4000
  split = sum(len(sampler.sample(pair, rng, 0.3, -1)) == 2 for _ in range(n))
  assert abs(split / n - 0.3) < 0.03
  text = 'Ein Mann ☃'
  ids = sampler.sample(sp.normalize(text), rng, 1.0, -1)
  assert sp.decode(ids) == text
  assert len(ids) == len(sp.normalize(text)) - 1 + len('☃'.encode())  # the snowman is bytes


def test_the_benchmark_runs_at_a_small_size():
  """bench/subword_sampling.py (its figures: bench/results/input_pipeline.md)."""
  out = subprocess.run([sys.executable, 'bench/subword_sampling.py', '--sentences=300',
                        '--repeats=1', '--vocab_size=500'], cwd=REPO, capture_output=True,
                       text=True, check=True).stdout
  report = json.loads(out)
  for kind in ('bpe', 'unigram'):
    assert report[kind]['us_per_sentence']['ours'] > 0


def test_the_word_caches_change_no_sample_and_stay_bounded(model, texts, monkeypatch):
  """A word's cached result (BPE: its segmentation when no merge is dropped; unigram: its
  sampling table) gives what computing it again gives, and the cache is cleared when full."""
  tok, sp, _ = model
  normalized = [sp.normalize(t) for t in texts[:300]]
  warm = subword_sampling.Sampler(tok.model_proto)
  subword_sampling.sample_batch(warm, normalized, 1, 0.2, -1)  # every word cached
  monkeypatch.setattr(subword_sampling, '_WORD_CACHE', 2)
  cold = subword_sampling.Sampler(tok.model_proto)
  assert subword_sampling.sample_batch(warm, normalized, 3, 0.2, -1) == \
      subword_sampling.sample_batch(cold, normalized, 3, 0.2, -1)
  assert len(cold._words) <= 2 < len(warm._words)  # pylint: disable=protected-access
