"""Decoding's speed paths return what the plain path returns: the loop that drops finished rows
(`drop_finished`, on by default; same tokens, beam scores equal to float rounding, as the
smaller batch's matmuls may round differently) and the two-reduction argmax of greedy decoding."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from autoregressive.strategies import BeamSearch, Limits, beam
from autoregressive.strategies.base import in_order, search_in_batches
from autoregressive.strategies.beam import beam_search_decode
from autoregressive.strategies.greedy import greedy_decode
from autoregressive.strategies.loop import compact_sizes, draw_tokens, first_argmax, prepare
from model import ModelConfig, bind, build_model, params_of

BATCH = 12
ROWS = 8  # drop_finished=ROWS: the loop goes on with 8 rows once at most 8 are unfinished
MAX_LEN = 12


def _model(kind='encoder_decoder', seed=0):
  # Two decoder layers (a cache per layer to grow and compact); the encoder runs once, outside
  # every loop, so one layer of it is enough and compiles faster.
  cfg = ModelConfig(kind=kind, vocab_size=20, num_encoder_layers=1, num_decoder_layers=2,
                    d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0, max_len=24)
  params = params_of(build_model(cfg, rngs=nnx.Rngs(seed)))
  return bind(cfg, jax.tree.map(lambda x: x * 2.0, params))  # peakier than the init


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


def _greedy_eos(model, **inputs) -> int:
  return _varied_eos(greedy_decode(model, max_new_tokens=MAX_LEN, eos_id=None,
                                            drop_finished=False, **inputs))


STAGES = (ROWS, 4, 2)  # drop_finished=STAGES: then on 4 rows, then on 2


def test_compact_sizes():
  assert [compact_sizes(b) for b in (4, 8, 64, 128)] == [(), (2,), (16, 4), (32, 8, 2)]
  assert [compact_sizes(64, d) for d in (False, 0, 5, 64, 100)] == [(), (), (5,), (), ()]
  assert compact_sizes(64, [100, 16, 3]) == (16, 3)
  for bad in (-1, (8, 8), (4, 8)):
    with pytest.raises(ValueError, match='drop_finished'):
      compact_sizes(64, bad)


def test_greedy_drops_finished_rows_with_the_same_tokens():
  model = _model()
  src = _sources()
  eos = _greedy_eos(model, inputs=src)
  # EOS allowed first: rows of this random model that end at once make the stages' case.
  kw = {'max_new_tokens': MAX_LEN, 'eos_id': eos, 'min_new_tokens': 0}
  plain = np.asarray(greedy_decode(model, src, drop_finished=False, **kw))
  assert _second_stage_runs(_steps(plain, eos))
  # True: compact_sizes(BATCH) rows. (A single stage of ROWS is the first of STAGES: no
  # program of its own.)
  for drop in (True, STAGES):
    fast = greedy_decode(model, src, drop_finished=drop, **kw)
    np.testing.assert_array_equal(np.asarray(fast), plain)


def test_beam_search_drops_finished_sentences_with_the_same_results():
  """Beam 1: it ends a sentence when greedy decoding ends it, so the later stages surely run.
  Wider beams with finished sentences dropped: test_beam_search_first_window_gives_the_same_results
  (beam 3, STAGES), test_decoder_only_prompts_of_different_lengths_drop_finished_rows (beam 2)
  and test_batched_search_drop_finished_option_gives_the_same_hypotheses (beam 3)."""
  model = _model(seed=0)
  src = _sources(seed=0)
  eos = _greedy_eos(model, inputs=src)
  kw = {'beam_size': 1, 'alpha': 0.6, 'max_new_tokens': MAX_LEN, 'eos_id': eos}
  ref_tokens, ref_scores = beam_search_decode(model, src,
                                                       drop_finished=False, **kw)
  assert _second_stage_runs(_steps(ref_tokens[:, 0], eos))
  # (A single stage of ROWS is the first of STAGES.)
  tokens, scores = beam_search_decode(model, src, drop_finished=STAGES, **kw)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens))
  # Fewer rows may round the matmuls differently (last bits); the tokens are the same.
  np.testing.assert_allclose(np.asarray(scores), np.asarray(ref_scores), rtol=1e-5, atol=1e-6)


def test_decoder_only_prompts_of_different_lengths_drop_finished_rows():
  model = _model('decoder_only', seed=2)
  prompt = np.zeros((BATCH, 5), np.int32)
  for i in range(BATCH):
    prompt[i, :i % 6] = np.arange(4, 4 + i % 6)  # lengths 0..5, force-fed in the loop
  eos = _greedy_eos(model, prompt=prompt)
  kw = {'prompt': prompt, 'max_new_tokens': MAX_LEN, 'eos_id': eos}
  greedy = [greedy_decode(model, drop_finished=d, **kw) for d in (ROWS, False)]
  assert _second_stage_runs(_steps(greedy[1], eos))
  np.testing.assert_array_equal(np.asarray(greedy[0]), np.asarray(greedy[1]))
  beams = [beam_search_decode(model, beam_size=2, alpha=0.6, drop_finished=d,
                                       **kw) for d in (ROWS, False)]
  np.testing.assert_array_equal(np.asarray(beams[0][0]), np.asarray(beams[1][0]))
  np.testing.assert_allclose(np.asarray(beams[0][1]), np.asarray(beams[1][1]), rtol=1e-5,
                             atol=1e-6)


# The first-window tests' case: an encoder-decoder (a cross-attention cache that the growing
# leaves alone) with a forced target prefix: a prefilled prefix (n0 > 1) and force-fed tokens,
# which a decoder-only model's prompt gives in the same loops (one case, not one per kind: a
# program less per search and setting).
WINDOW_PROMPT = np.array([[4, 5, 6], [7, 8, 0], [9, 0, 0]] * 4, np.int32)


def _window_case():
  """(model, inputs, prompt, eos, lengths, prefill_len), the arguments as `prepare` makes them."""
  model = _model(seed=0)
  eos = _greedy_eos(model, inputs=_sources(seed=0), prompt=WINDOW_PROMPT)
  return (model, *prepare(model.config, _sources(seed=0), WINDOW_PROMPT, MAX_LEN), eos)


def _unfinished_after(steps, lengths, prefill_len, calls: int) -> int:
  """How many rows (their decoder `steps` `[batch]`, prompt `lengths`) are still decoding after
  the loop's first `calls` calls (the first call, before the loop, made target index
  `prefill_len`)."""
  return int(np.sum(np.asarray(lengths) + steps - 1 > prefill_len + calls))


def test_beam_search_first_window_gives_the_same_results():
  """The slot layout's first steps on a shorter cache, then the whole one: same results."""
  model, inputs, prompt, lengths, prefill_len, eos = _window_case()
  kw = {'beam_size': 3, 'max_new_tokens': MAX_LEN, 'prefill_len': prefill_len, 'eos_id': eos}
  found = [beam.search(model.config, params_of(model), inputs, prompt, lengths,
                              jnp.float32(0.6), np.int32(1), first_window=w, compact_rows=rows,
                              **kw)
           for w, rows in ((0, ()), (2, ()), (3, STAGES), (3, (2,)))]
  # After the short cache's 3 calls more than 2 sentences are unfinished (every row grows, then
  # the loop goes on), and few enough (by their best hypotheses; a sentence may go on after
  # its best ended) that at most 8 are left (only they grow): both of window_then_whole's
  # branches.
  steps = _steps(np.asarray(found[0][0])[:, 0], eos)
  assert 2 < _unfinished_after(steps, lengths, prefill_len, 3) <= ROWS
  for tokens, scores in found[1:]:
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(found[0][0]))
    np.testing.assert_allclose(np.asarray(scores), np.asarray(found[0][1]), rtol=1e-5,
                               atol=1e-6)


def test_greedy_and_sampling_first_window_give_the_same_tokens():
  """Greedy decoding's (and sampling's) first loop calls on a shorter cache, then the whole
  one: the same tokens, with and without finished rows dropped, with keys per row. (Sampling
  shares greedy's loop: it is checked on the case that goes through every stage; this is also
  the check that sampling with keys per row drops finished rows with the same samples.)"""
  model, inputs, prompt, lengths, prefill_len, eos = _window_case()
  config, params = model.config, params_of(model)
  keys = jax.random.split(jax.random.PRNGKey(3), BATCH)
  every = ((0, ()), (2, ()), (3, STAGES), (3, (2,)))
  for greedy, rng, cases in ((True, jax.random.PRNGKey(0), every), (False, keys, every[::2])):
    found = [draw_tokens(config, params, inputs, prompt, lengths, rng, jnp.float32(0.8),
                                jnp.float32(1.0), np.int32(1), max_new_tokens=MAX_LEN,
                                prefill_len=prefill_len, greedy=greedy, top_k=None,
                                use_top_p=False, eos_id=eos, compact_rows=rows, first_window=w)
             for w, rows in cases]
    assert _second_stage_runs(_steps(found[0], eos))
    if greedy:  # both of window_then_whole's branches, as in the beam search test above
      assert 2 < _unfinished_after(_steps(found[0], eos), lengths, prefill_len, 3) <= ROWS
    for tokens in found[1:]:
      np.testing.assert_array_equal(np.asarray(tokens), np.asarray(found[0]))


# The stopping rule is the searches' shared step (`beam._Stepper`): every penalty sign
# on the slot layout, one on the reference layout (that it passes `nbest` on).
@pytest.mark.parametrize('alpha,reorder_cache', [(0.0, False), (1.5, False), (-0.5, False),
                                                 (-0.5, True)])
def test_beam_search_stopping_at_the_final_nbest_gives_the_same_nbest(alpha, reorder_cache):
  """With `nbest` < beam size a sentence stops once its n best cannot be overtaken: the same
  n tokens and scores as the k-best search (any length penalty sign), and it does stop sooner.
  (Seed 0 and alpha 1.5: a bound that forgets the penalty can grow stops too soon here.)"""
  model = _model(seed=0)
  src = _sources(seed=0)
  kw = {'beam_size': 4, 'alpha': alpha, 'max_new_tokens': MAX_LEN,
        'eos_id': _greedy_eos(model, inputs=src)}
  # The k-best search on the slot layout for both layouts (the layouts' k-best searches agree:
  # test_decoding's test_beam_search_equals_reference_cache_reordering): a program less.
  full_tokens, full_scores = beam_search_decode(model, src, **kw)
  sooner = False
  for n in (1, 2):
    tokens, scores = beam_search_decode(model, src, nbest=n,
                                                 reorder_cache=reorder_cache, **kw)
    np.testing.assert_array_equal(np.asarray(tokens)[:, :n], np.asarray(full_tokens)[:, :n])
    np.testing.assert_allclose(np.asarray(scores)[:, :n], np.asarray(full_scores)[:, :n],
                               rtol=1e-5, atol=1e-6)
    sooner |= bool(np.any(~np.isfinite(np.asarray(scores)[:, n:]) &
                          np.isfinite(np.asarray(full_scores)[:, n:])))
  if alpha <= 0:  # (with alpha > 0 the bound, at max_new_tokens' penalty, rarely stops early)
    assert sooner  # some sentence stopped before its 4 best were final
  with pytest.raises(ValueError, match='nbest must be in'):
    beam_search_decode(model, src, nbest=5, **kw)


def test_batched_search_drop_finished_option_gives_the_same_hypotheses():
  model = _model(seed=1)
  src = _sources(seed=1)
  eos = _greedy_eos(model, inputs=src)
  sources = [[int(t) for t in row if t] for row in src]
  limits = Limits(max_new_tokens=MAX_LEN, batch_size=BATCH, nbest=3)
  found = [search_in_batches(model, BeamSearch(beam_size=3, alpha=0.6), limits, sources,
                             eos_id=eos, drop_finished=d)
           for d in (ROWS, False)]
  for fast, plain in zip(found[0], found[1], strict=True):
    assert [h.tokens for h in fast] == [h.tokens for h in plain]
    np.testing.assert_allclose([h.score for h in fast], [h.score for h in plain], rtol=1e-5)


def test_batched_search_workers_give_the_same_hypotheses_in_order():
  """Batches decoded two at a time (threads) come back as one at a time gives them: sources
  of two length buckets (two shapes, each compiled by its first batch)."""
  model = _model(seed=2)
  rng = np.random.RandomState(2)
  sources = [list(rng.randint(3, 20, size=n)) + [1] for n in (3, 20, 5, 18, 2, 7, 21, 4, 6)]
  sources.insert(4, None)  # an empty line stays None
  search = (BeamSearch(beam_size=2, alpha=0.6), Limits(max_new_tokens=MAX_LEN, batch_size=2,
                                                      nbest=2))
  done = []
  found = [search_in_batches(model, *search, sources, progress=done.append, workers=w)
           for w in (1, 2)]
  assert found[1][4] is None and sum(done) == 2 * 9
  for two, one in zip(found[1], found[0], strict=True):
    assert (two is None) == (one is None)
    if one is not None:
      assert [h.tokens for h in two] == [h.tokens for h in one]
      np.testing.assert_allclose([h.score for h in two], [h.score for h in one], rtol=1e-6)


def test_batched_search_decodes_the_longest_sources_first(monkeypatch):
  """So that a pass does not end with one worker on the slowest batch while the others wait;
  a short batch's padding rows repeat its shortest source (an empty one may decode for long)."""
  model = _model(seed=2)
  batches = []

  def record(self, module, inputs, **_):  # stands in for the search: one empty output a row
    batches.append(inputs)
    return np.zeros((inputs.shape[0], 1, 1), np.int32), np.zeros((inputs.shape[0], 1))

  monkeypatch.setattr(BeamSearch, 'search', record)
  sources = [[5] * n + [1] for n in (3, 20, 5, 18, 2, 7, 4)]
  search_in_batches(model, BeamSearch(beam_size=2, alpha=0.6),
                    Limits(max_new_tokens=MAX_LEN, batch_size=3), sources, workers=1)
  assert [int(np.max(np.sum(b != 0, axis=1))) for b in batches] == [21, 6, 3]
  assert [b.shape[0] for b in batches] == [3, 3, 3]
  np.testing.assert_array_equal(batches[-1][1:], np.tile(batches[-1][:1], (2, 1)))


def test_in_order_runs_a_new_shape_beside_other_shapes_and_before_its_own():
  """The first batch of a new shape (it compiles) runs beside the other shapes' batches, the
  later batches of its shape start after it; once a shape has run, nothing waits."""
  log, lock, events = [], threading.Lock(), {}

  def fn(batch):
    name, _ = batch
    with lock:
      log.append(('start', name))
    events[name].set()
    if name in waits_for:  # runs until the batch it names has started beside it (or fails)
      assert events[waits_for[name]].wait(20), f'{name} ran alone'
    with lock:
      log.append(('end', name))
    return name

  a, b = np.zeros((2, 16), np.int32), np.zeros((2, 32), np.int32)
  batches = [('a1', a), ('b1', b), ('a2', a), ('b2', b)]
  ready, waits_for = set(), {'a1': 'b1'}
  events.update({name: threading.Event() for name, _ in batches})
  assert list(in_order(fn, batches, 2, ready)) == ['a1', 'b1', 'a2', 'b2']
  assert log.index(('start', 'a2')) > log.index(('end', 'a1'))
  assert log.index(('start', 'b2')) > log.index(('end', 'b1'))
  assert ready == {a.shape, b.shape}
  log.clear()
  waits_for = {'a1': 'a2'}  # a shape that has run: its batches run side by side
  events.update({name: threading.Event() for name, _ in batches})
  assert list(in_order(fn, batches, 2, ready)) == ['a1', 'b1', 'a2', 'b2']
  # Sorted by length (each shape's batches together): two new shapes' first batches still
  # run side by side, and a later batch of the second shape waits for its first.
  c, d = np.zeros((2, 48), np.int32), np.zeros((2, 64), np.int32)
  batches = [('c1', c), ('c2', c), ('c3', c), ('d1', d), ('d2', d)]
  log.clear()
  waits_for = {'c1': 'd1'}
  events.update({name: threading.Event() for name, _ in batches})
  assert list(in_order(fn, batches, 2, ready)) == ['c1', 'c2', 'c3', 'd1', 'd2']
  assert log.index(('start', 'c2')) > log.index(('end', 'c1'))
  assert log.index(('start', 'd2')) > log.index(('end', 'd1'))


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
  got = np.asarray(jax.jit(first_argmax)(jnp.asarray(x)))
  # NumPy's argmax: the first NaN (jnp.argmax on GPU took the later one, column 60).
  np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
  assert got.dtype == np.int32 and list(got[1:6]) == [0, 7, 50, 0, 299]
  # A left-out column (pad) is never chosen, even as the only maximum or NaN; blocks of 30.
  x[0, 0], x[5, 0], x[1, 1] = 99.0, np.nan, 5.0
  for exclude in (0, 1, 31):
    left_out = x.copy()
    left_out[:, exclude] = -np.inf
    got = np.asarray(jax.jit(first_argmax, static_argnums=1)(jnp.asarray(x), exclude))
    np.testing.assert_array_equal(got, np.argmax(left_out, axis=-1))
  # And EOS in the rows where it is banned (min_new_tokens), in pad's block or another one.
  banned = np.array([True, False, True, True, False, True])
  for eos in (1, 31, 299):
    y = x.copy()
    y[:, eos] = 1e9  # EOS is every row's best
    run = jax.jit(lambda v, b, eos=eos: first_argmax(v, 0, eos_banned=b, eos_id=eos))
    got = np.asarray(run(jnp.asarray(y), jnp.asarray(banned)))
    y[:, 0] = -np.inf
    y[banned, eos] = -np.inf
    np.testing.assert_array_equal(got, np.argmax(y, axis=-1))


def test_a_rows_search_over_a_language_models_prompt():
  """The token door on a decoder-only model: a row's `search` takes the prompt by keyword or
  as its positional array alike, and greedy decoding's and sampling's scores are the log P of
  each continuation under the model (a full forward pass over prompt + output, here)."""
  from autoregressive.strategies import Greedy, Sampling  # pylint: disable=import-outside-toplevel
  model = _model('decoder_only', seed=4)
  prompt = np.random.RandomState(4).randint(3, 20, size=(3, 5)).astype(np.int32)
  forward = jax.jit(lambda m, x: m(x))  # one width (causal: the padding after is never read)
  for row, nbest in ((Greedy(), 1), (Sampling(temperature=1.0, seed=2), 3)):
    limits = Limits(max_new_tokens=6, nbest=nbest)
    tokens, scores = row.search(model, prompt=prompt, limits=limits)
    again = row.search(model, prompt, limits=limits)
    np.testing.assert_array_equal(again[0], tokens)
    np.testing.assert_array_equal(again[1], scores)
    assert tokens.shape == (3, nbest, 6) and scores.shape == (3, nbest)
    assert np.all(np.diff(scores, axis=1) <= 0), row.NAME  # best first
    for b in range(3):
      for j in range(nbest):
        out = list(tokens[b, j])
        out = out[:out.index(1) + 1] if 1 in out else out  # up to EOS
        full = np.zeros((1, 5 + 6), np.int32)
        full[0, :5 + len(out)] = list(prompt[b]) + out
        logits = np.asarray(forward(model, full), np.float64)[0]
        logits[:, 0] = -np.inf  # the pad id is never an output
        log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                keepdims=True)) - logits.max(-1, keepdims=True)
        expected = sum(log_p[5 + t, tok] for t, tok in enumerate(out))
        np.testing.assert_allclose(scores[b, j], expected, rtol=1e-4, atol=1e-4)
