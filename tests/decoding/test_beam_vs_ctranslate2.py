"""Our searches against CTranslate2's on the CTranslate2 export of a small trained model
(trained here in a few seconds on a synthetic translation task, stopped while the model is
still unsure, so that beams differ): the same outputs for greedy decoding and beam search,
where no float near-tie decides (`beam_reference`), and never an empty one."""

import functools

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from autoregressive.strategies.beam import beam_search_decode
from autoregressive.strategies.greedy import greedy_decode
from configs import default
from hf_export import ctranslate2 as ct2_export
from model import bind, build_model, params_of
from model.build import as_config
from tests import beam_reference, extras

ctranslate2 = extras.require('ctranslate2')  # the [ct2] extra, which [test] includes

VOCAB, SRC_LEN, MAX_NEW = 24, 10, 16
PAD_BOOST = 6.0
EMPTY = 0.1
EOS = beam_reference.EOS


class _Pieces:
  """A vocabulary with EOS (the export's tokenizer): <pad>, </s>, <unk>, then w3..w23."""
  name, vocab_size, eos_id = 'pieces', VOCAB, EOS

  def id_to_piece(self, i: int) -> str:
    return ['<pad>', '</s>', '<unk>'][i] if i < 3 else f'w{i}'


def _pairs(rng, n: int):
  """(source, target) token lists: the target is the source reversed, each token mapped, and
  a token repeated where the source has a small one (lengths vary with the content). One
  target in EMPTY is empty, as in real parallel corpora (misaligned or untranslated lines):
  the model's single most likely output is then often the empty one, though most of its
  probability is on translations (Stahlberg & Byrne 2019)."""
  pairs = []
  for _ in range(n):
    src = [int(t) for t in rng.integers(3, VOCAB, rng.integers(2, SRC_LEN - 1))]
    tgt = []
    for t in reversed(src):
      mapped = (t * 7) % (VOCAB - 3) + 3
      tgt += [mapped, mapped] if t < 8 else [mapped]
    if rng.random() < EMPTY:
      tgt = []
    pairs.append((src + [EOS], tgt[:MAX_NEW - 1] + [EOS]))
  return pairs


def _batch(pairs):
  inputs = np.zeros((len(pairs), SRC_LEN), np.int32)
  targets = np.zeros((len(pairs), MAX_NEW), np.int32)
  for row, (src, tgt) in enumerate(pairs):
    inputs[row, :len(src)], targets[row, :len(tgt)] = src, tgt
  return inputs, targets


_OPTIMIZER = optax.adam(3e-3)


@functools.partial(jax.jit, static_argnums=0)
def _train_step(config, params, opt_state, inputs, targets):
  def loss(p):
    logits = bind(config, p)(inputs, targets)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (ce * (targets > 0)).sum() / (targets > 0).sum()
  updates, opt_state = _OPTIMIZER.update(jax.grad(loss)(params), opt_state)
  return optax.apply_updates(params, updates), opt_state


@functools.cache
def _trained(seed: int, steps: int = 80):
  """A tiny encoder-decoder (an NNX model) trained `steps` Adam steps on `_pairs` (one compile
  for every seed: the same config)."""
  config = default.get_config('tiny').model
  config.update(vocab_size=VOCAB, dropout_rate=0.0, max_len=32, logits_via_embedding=False)
  config = as_config(config)
  params = params_of(build_model(config, rngs=nnx.Rngs(seed)))
  rng = np.random.default_rng(seed)
  opt_state = _OPTIMIZER.init(params)
  for _ in range(steps):
    params, opt_state = _train_step(config, params, opt_state, *_batch(_pairs(rng, 32)))
  # Pad is never a target, so training drives its probability to ~1e-4; raised here (P(pad) of
  # a few percent) so that a search that counted the mass of pad, which none can output, would
  # rank hypotheses otherwise than CTranslate2.
  logits = params['decoder']['logits']
  logits['bias'] = logits['bias'].at[0].add(PAD_BOOST)
  return bind(config, params)


def test_greedy_and_beam_search_equal_ctranslate2s(tmp_path):
  """One seed: every code path (greedy, beam 2 and 4, pad's raised mass, the near-tie rule)
  runs on it, and the asserts below check that its case is one where the search matters
  (other seeds only drew other data; test_export_ct2's trained test compares the same searches
  on a real Multi30k model)."""
  seed = 0
  model = _trained(seed)
  spec = ct2_export.model_spec(params_of(model), model.config, _Pieces())
  spec.optimize(quantization=None)
  spec.save(str(tmp_path))
  translator = ctranslate2.Translator(str(tmp_path), intra_threads=1)
  sources = [src for src, _ in _pairs(np.random.default_rng(100 + seed), 24)]
  inputs, _ = _batch([(s, []) for s in sources])
  pieces = [[_Pieces().id_to_piece(t) for t in s[:-1]] for s in sources]
  outputs, ties = {}, 0
  for beam in (1, 2, 4):
    if beam == 1:  # what the Translator runs for beam size 1
      ours = greedy_decode(model, inputs, max_new_tokens=MAX_NEW)
    else:
      ours = beam_search_decode(model, inputs, beam_size=beam, alpha=0.0,
                                max_new_tokens=MAX_NEW)[0][:, 0]
    ours = [[int(t) for t in row if t] for row in np.asarray(ours)]
    results = translator.translate_batch(pieces, beam_size=beam, length_penalty=0.0,
                                         max_decoding_length=MAX_NEW, min_decoding_length=1)
    theirs = [[int(p[1:]) for p in r.hypotheses[0]] for r in results]
    assert all(o and o != [EOS] for o in ours) and all(theirs)  # never an empty output

    def reference(i, beam=beam):
      search = beam_reference.model_next_log_probs(model, inputs[i], MAX_NEW, beam)
      return beam_reference.beam_search(search, k=beam, max_new_tokens=MAX_NEW)
    ties += beam_reference.differences_are_ties(ours, theirs, reference)
    outputs[beam] = ours
  assert ties <= 2
  # The case is one where the search matters: most outputs end with EOS, and the beam finds
  # other outputs than greedy decoding for some sources.
  assert sum(o[-1] == EOS for o in outputs[4]) >= 18
  assert outputs[4] != outputs[1]


def test_no_empty_output_for_a_non_empty_source():
  """Greedy, beam search and sampling, and every hypothesis of their n-best lists, give at least
  `min_new_tokens` tokens before EOS (default 1: no empty output), on a model whose most
  likely output is the empty one for many sources (and for greedy decoding too: seed 2 after
  60 steps); with `min_new_tokens=0` those come back."""
  from autoregressive.strategies import BeamSearch, Greedy, Limits, Sampling  # pylint: disable=import-outside-toplevel
  from autoregressive.strategies.base import search_in_batches  # pylint: disable=import-outside-toplevel
  model = _trained(2, steps=60)
  sources = [src for src, _ in _pairs(np.random.default_rng(102), 24)]
  searches = {'greedy': (Greedy(), 1), 'beam': (BeamSearch(beam_size=4, alpha=0.0), 4),
              'sampling': (Sampling(temperature=1.0, seed=1), 4)}

  def lengths(least, strategy, nbest):  # tokens before EOS, every hypothesis of every source
    limits = Limits(max_new_tokens=MAX_NEW, min_new_tokens=least, batch_size=8, nbest=nbest)
    found = search_in_batches(model, strategy, limits, sources)
    assert all(len(h) == nbest for h in found)
    return [len([t for t in h.tokens if t != EOS]) for hyps in found for h in hyps]
  for name, search in searches.items():
    assert min(lengths(1, *search)) >= 1, name
    assert min(lengths(3, *search)) >= 3, name
    assert min(lengths(0, *search)) == 0, name  # the case: empty outputs without the minimum


def test_the_greedy_tie_rule_accepts_only_near_ties():
  """The rule the export tests apply to greedy outputs (beam_reference): equal outputs, or a
  first difference where both tokens are within 1e-3 of the best logit."""
  def next_log_probs(prefixes):
    return np.array([[0.0, 0.0, 5.0, 5.0 - 5e-4, 1.0]] * len(prefixes))
  assert beam_reference.greedy_difference_is_a_tie([2, 4], [2, 4], next_log_probs) == 0
  assert beam_reference.greedy_difference_is_a_tie([2, 4], [3, 1], next_log_probs) == 1
  with pytest.raises(AssertionError, match='with no tie'):
    beam_reference.greedy_difference_is_a_tie([2], [4], next_log_probs)
  with pytest.raises(AssertionError, match='prefix'):
    beam_reference.greedy_difference_is_a_tie([2], [2, 3], next_log_probs)
