"""Decoding's speed paths return what the plain path returns: the loop that drops finished rows
(`drop_finished`, on by default; same tokens, beam scores equal to float rounding, as the
smaller batch's matmuls may round differently) and the two-reduction argmax of greedy decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference import decoding
from inference.decode_loop import compact_size
from inference.translator import Translator
from model import ModelConfig, build_model
from model.kinds import adapter_of

BATCH = 12
ROWS = 8  # drop_finished=ROWS: the loop goes on with 8 rows once at most 8 are unfinished
MAX_LEN = 12


def _model(kind='encoder_decoder', seed=0):
  cfg = ModelConfig(kind=kind, vocab_size=20, num_encoder_layers=2, num_decoder_layers=2,
                    d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0, max_len=24)
  module = build_model(cfg)
  params = module.init(jax.random.PRNGKey(seed), *adapter_of(module).example_inputs(4))['params']
  return module, jax.tree.map(lambda x: x * 2.0, params)  # peakier than the init


def _sources(batch=BATCH, length=7, seed=0):
  rng = np.random.RandomState(seed)
  src = rng.randint(3, 20, size=(batch, length)).astype(np.int32)
  for i in range(batch):
    src[i, length - i % 5:] = 0  # different lengths in one batch
  return src


def _steps(tokens, eos):
  """Each row's decoder steps `[batch]` when `eos` ends it: up to its first `eos`, or all."""
  tokens = np.asarray(tokens)
  hit = tokens == eos
  return np.where(hit.any(-1), np.argmax(hit, -1) + 1, tokens.shape[-1])


def _second_stage_runs(steps, rows=ROWS) -> bool:
  """Whether rows were still decoding once at most `rows` were (`steps` `[batch]`), so that
  comparing with the plain path covers the loop's second stage."""
  steps = np.sort(steps)[::-1]
  return steps[rows] < steps[0]


def _varied_eos(tokens) -> int:
  """An id that, taken as EOS, ends these outputs (`eos_id=None`) at varied steps (random
  small models mostly end all at once, or never, with EOS 1)."""
  for eos in range(2, 20):
    if _second_stage_runs(_steps(tokens, eos)):
      return eos
  raise AssertionError(f'no id ends these outputs at varied steps: {np.asarray(tokens)}')


def _greedy_eos(module, params, **inputs) -> int:
  return _varied_eos(decoding.greedy_decode(module, params, max_new_tokens=MAX_LEN, eos_id=None,
                                            drop_finished=False, **inputs))


def test_compact_size():
  assert [compact_size(b) for b in (4, 8, 64)] == [0, 2, 16]
  assert [compact_size(64, d) for d in (False, 0, 5, 64, 100)] == [0, 0, 5, 0, 0]
  with pytest.raises(ValueError, match='drop_finished'):
    compact_size(8, -1)


def test_greedy_drops_finished_rows_with_the_same_tokens():
  module, params = _model()
  src = _sources()
  eos = _greedy_eos(module, params, inputs=src)
  kw = {'max_new_tokens': MAX_LEN, 'eos_id': eos}
  plain = np.asarray(decoding.greedy_decode(module, params, src, drop_finished=False, **kw))
  assert _second_stage_runs(_steps(plain, eos))
  for drop in (ROWS, True):  # True: compact_size(BATCH) rows
    fast = decoding.greedy_decode(module, params, src, drop_finished=drop, **kw)
    np.testing.assert_array_equal(np.asarray(fast), plain)


@pytest.mark.parametrize('beam_size', [1, 3])
def test_beam_search_drops_finished_sentences_with_the_same_results(beam_size):
  module, params = _model(seed=1)
  src = _sources(seed=1)
  eos = _greedy_eos(module, params, inputs=src)
  kw = {'beam_size': beam_size, 'alpha': 0.6, 'max_new_tokens': MAX_LEN, 'eos_id': eos}
  tokens, scores = decoding.beam_search_decode(module, params, src, drop_finished=ROWS, **kw)
  ref_tokens, ref_scores = decoding.beam_search_decode(module, params, src,
                                                       drop_finished=False, **kw)
  if beam_size == 1:  # beam 1 ends a sentence when greedy decoding ends it
    assert _second_stage_runs(_steps(ref_tokens[:, 0], eos))
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens))
  # Fewer rows may round the matmuls differently (last bits); the tokens are the same.
  np.testing.assert_allclose(np.asarray(scores), np.asarray(ref_scores), rtol=1e-5, atol=1e-6)


def test_decoder_only_prompts_of_different_lengths_drop_finished_rows():
  module, params = _model('decoder_only', seed=2)
  prompt = np.zeros((BATCH, 5), np.int32)
  for i in range(BATCH):
    prompt[i, :i % 6] = np.arange(4, 4 + i % 6)  # lengths 0..5, force-fed in the loop
  eos = _greedy_eos(module, params, prompt=prompt)
  kw = {'prompt': prompt, 'max_new_tokens': MAX_LEN, 'eos_id': eos}
  greedy = [decoding.greedy_decode(module, params, drop_finished=d, **kw) for d in (ROWS, False)]
  assert _second_stage_runs(_steps(greedy[1], eos))
  np.testing.assert_array_equal(np.asarray(greedy[0]), np.asarray(greedy[1]))
  beams = [decoding.beam_search_decode(module, params, beam_size=2, alpha=0.6, drop_finished=d,
                                       **kw) for d in (ROWS, False)]
  np.testing.assert_array_equal(np.asarray(beams[0][0]), np.asarray(beams[1][0]))
  np.testing.assert_allclose(np.asarray(beams[0][1]), np.asarray(beams[1][1]), rtol=1e-5,
                             atol=1e-6)


def test_sampling_with_keys_per_row_drops_finished_rows_with_the_same_samples():
  module, params = _model(seed=3)
  keys = jax.random.split(jax.random.PRNGKey(7), BATCH)
  kw = {'inputs': _sources(seed=3), 'rng': keys, 'max_new_tokens': MAX_LEN, 'temperature': 0.7}
  eos = _varied_eos(decoding.sample(module, params, eos_id=None, **kw))
  fast = decoding.sample(module, params, eos_id=eos, drop_finished=ROWS, **kw)
  plain = decoding.sample(module, params, eos_id=eos, drop_finished=False, **kw)
  assert _second_stage_runs(_steps(plain, eos))
  np.testing.assert_array_equal(np.asarray(fast), np.asarray(plain))


def test_translator_drop_finished_option_gives_the_same_hypotheses():
  module, params = _model(seed=1)
  src = _sources(seed=1)
  eos = _greedy_eos(module, params, inputs=src)
  sources = [[int(t) for t in row if t] for row in src]
  found = [Translator(module, params, beam_size=3, alpha=0.6, max_new_tokens=MAX_LEN,
                      batch_size=BATCH, eos_id=eos, nbest=3, drop_finished=d).search(sources)
           for d in (ROWS, False)]
  for fast, plain in zip(found[0], found[1], strict=True):
    assert [h.tokens for h in fast] == [h.tokens for h in plain]
    np.testing.assert_allclose([h.score for h in fast], [h.score for h in plain], rtol=1e-5)


def test_first_argmax_equals_argmax_ties_infinities_and_nan_included():
  rng = np.random.RandomState(0)
  x = rng.randint(0, 4, size=(6, 300)).astype(np.float32)  # many ties
  x[1] = -np.inf
  x[2, 7] = np.inf
  x[2, 9] = np.inf
  x[3, 50] = np.nan
  x[3, 60] = np.nan
  x[4] = np.nan
  x[5, -1] = 9.0
  got = np.asarray(jax.jit(decoding.first_argmax)(jnp.asarray(x)))
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
  assert got.dtype == np.int32 and list(got[1:6]) == [0, 7, 50, 0, 299]
