"""The searches (autoregressive/strategies/: greedy, sampling, beam and their shared loop) with
a KV cache, against the full forward pass, exhaustive enumeration and the cache's operations."""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from autoregressive.scoring import sequence_log_probs
from autoregressive.strategies.beam import beam_search_decode
from autoregressive.strategies.greedy import greedy_decode
from autoregressive.strategies.sampling import sample
from model import ModelConfig, bind, build_model, params_of
from model.build import unrolled
from model.kinds import adapter_of
from model.stacks import stack_layer_params

EOS = 1


def _model(kind='encoder_decoder', vocab=20, max_len=24, seed=0, eos_boost=1.0, scale=2.0,
           **kw):
  cfg = ModelConfig(kind=kind, vocab_size=vocab, num_encoder_layers=2, num_decoder_layers=2,
                    d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0, max_len=max_len, **kw)
  params = params_of(build_model(cfg, rngs=nnx.Rngs(seed)))
  # Larger weights give peakier, more varied distributions than the near-uniform init.
  params = jax.tree.map(lambda x: x * scale, params)
  if eos_boost != 1.0:  # make EOS likely enough that some (not all) sequences end early
    emb = params['embed']['embedding']
    params['embed']['embedding'] = emb.at[EOS].multiply(eos_boost)
  return bind(cfg, params)


def _sources(batch=3, length=7, vocab=20, seed=0):
  rng = np.random.RandomState(seed)
  src = rng.randint(3, vocab, size=(batch, length)).astype(np.int32)
  for i in range(1, batch):  # different source lengths in one batch
    src[i, length - 2 * i:] = 0
  return src


@functools.partial(jax.jit, static_argnums=0)
def _forward_log_probs(config, params, *args):
  return _log_softmax_without_pad(bind(config, params)(*args))


def _log_softmax_without_pad(logits):
  """The model's log-probabilities over the tokens an output can hold (pad = 0 never is)."""
  return jax.nn.log_softmax(jnp.asarray(logits).at[..., 0].set(-jnp.inf))


def _greedy_by_full_forward(model, prompt, num_tokens, width):
  """Greedy continuation of a decoder-only `prompt` (list of ids), one full forward pass per
  token over a fixed `width` (one compile), never choosing the pad id 0."""
  seq = list(prompt)
  for _ in range(num_tokens):
    padded = np.array([seq + [3] * (width - len(seq))], np.int32)
    log_probs = _log_probs_full(model, None, padded)[0, len(seq)].copy()
    log_probs[0] = -np.inf
    seq.append(int(log_probs.argmax()))
  return seq[len(prompt):]


def _log_probs_full(model, inputs, targets):
  """log_softmax (pad left out) of the full teacher-forced forward pass `[batch, len, vocab]`."""
  targets = np.asarray(targets)
  # A pad target would mask its own query; fill it (only future positions read it).
  filled = np.where(targets == 0, 3, targets)
  args = (filled,) if inputs is None else (np.asarray(inputs), filled)
  return np.asarray(_forward_log_probs(model.config, params_of(model), *args))


def _greedy_full(model, inputs, max_len, eos=EOS):
  """Greedy decoding by re-running the full forward pass for every token."""
  out = np.zeros((inputs.shape[0], max_len), np.int32)
  done = np.zeros(inputs.shape[0], bool)
  for t in range(max_len):
    lp = _log_probs_full(model, inputs, out)[:, t].copy()
    lp[:, 0] = -np.inf
    tok = lp.argmax(-1)
    out[:, t] = np.where(done, 0, tok)
    done |= tok == eos
  return out


_step = jax.jit(lambda config, params, *args: adapter_of(config).decoder_step(
    bind(config, params), *args), static_argnums=0)


def _score(lp_rows, seq, alpha):
  """sum log P up to and including EOS, over the GNMT length penalty."""
  total, n = 0.0, 0
  for t, tok in enumerate(seq):
    total += lp_rows[t, tok]
    n += 1
    if tok == EOS:
      break
  return total / ((5 + n) / 6) ** alpha


# ----------------------------------------------------------------------------- cache

def _full_and_cached_steps(model, src, tgt):
  """-> (full forward logits, the same from the KV cache one token at a time), both
  `[batch, len, vocab]`; `src` is None for a decoder-only model."""
  args = (tgt,) if src is None else (src, tgt)
  full = np.asarray(jax.jit(lambda p, *a: bind(model.config, p)(*a))(params_of(model), *args))
  model = unrolled(model)  # a KV cache per layer
  config, params = model.config, params_of(model)
  encoded = None if src is None else jax.jit(
      lambda p, s: bind(config, p).encode(s))(params, src)
  cache = adapter_of(model).init_cache(model, encoded, src, *tgt.shape)
  dec_in = np.pad(tgt, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for t in range(tgt.shape[1]):
    logits, cache = _step(config, params, cache, src, dec_in[:, t:t + 1])
    steps.append(np.asarray(logits[:, 0]))
  return full, np.stack(steps, axis=1), encoded


# The plain KV cache against the full pass, step by step and after a prefill, for each
# positional encoding and norm position: test_model's test_kv_cache_matches_full_forward_*.

@pytest.mark.parametrize('kind,scan', [('encoder_decoder', False), ('decoder_only', True)])
def test_float32_residual_in_bfloat16_caches_like_the_full_forward(kind, scan):
  """residual_dtype='float32' with bfloat16 matmuls: the KV cache (bfloat16, from the
  projections) and the float32 stream give the full forward pass's logits, to bf16 rounding."""
  extra = {} if kind == 'encoder_decoder' else {'positional_encoding': 'learned',
                                                'norm_position': 'pre'}
  # The init's scale (not the peakier x2): with x2, one bfloat16 rounding of 360 logits
  # flipped a near-tie of attention on GPU and moved a whole row by up to 5.
  model = _model(kind, dtype='bfloat16', residual_dtype='float32', scan_layers=scan, scale=1.0,
                 **extra)
  tgt = np.random.RandomState(3).randint(2, 20, size=(3, 6)).astype(np.int32)
  src = _sources() if kind == 'encoder_decoder' else None
  full, cached, encoded = _full_and_cached_steps(model, src, tgt)
  assert encoded is None or encoded.dtype == jnp.bfloat16
  np.testing.assert_allclose(cached, full, atol=0.05 * np.abs(full).max())


# ----------------------------------------------------------------------------- greedy

def test_greedy_equals_full_forward_greedy_with_eos():
  model = _model(eos_boost=1.6)
  src = _sources(batch=4)
  out = np.asarray(greedy_decode(model, src, max_new_tokens=8))
  ref = _greedy_full(model, src, 8)
  np.testing.assert_array_equal(out, ref)
  assert out.shape == (4, 8)
  ended = (out == EOS).any(axis=1)
  assert ended.any() and not ended.all(), out  # exercises both EOS and max_len endings
  for row in out:  # zeros after EOS
    if (row == EOS).any():
      assert (row[np.argmax(row == EOS) + 1:] == 0).all()
  assert (out != 0).sum() > 0 and not (out[:, 0] == 0).any()


def test_greedy_decoder_only_prompts_of_different_lengths():
  model = _model('decoder_only', vocab=20, max_len=20)
  prompts = [[5, 6, 7, 8, 9], [3], [4, 4, 12], []]
  width = max(map(len, prompts))
  batch = np.zeros((len(prompts), width), np.int32)
  for i, p in enumerate(prompts):
    batch[i, :len(p)] = p
  out = np.asarray(greedy_decode(model, prompt=batch, max_new_tokens=6,
                                 eos_id=None))
  alone = np.asarray(greedy_decode(model, prompt=batch[:1, :5], max_new_tokens=6,
                                   eos_id=None))
  np.testing.assert_array_equal(out[0], alone[0])
  for i, p in enumerate(prompts):
    # Against the full forward pass on [0] + prompt + generated (fixed width: one compile).
    np.testing.assert_array_equal(out[i], _greedy_by_full_forward(model, p, 6, 12))


def test_too_long_is_a_clear_error():
  model = _model(max_len=10)
  with pytest.raises(ValueError, match='max_len'):
    greedy_decode(model, _sources(length=7), max_new_tokens=11)
  with pytest.raises(ValueError, match='max_len'):
    greedy_decode(model, _sources(length=11), max_new_tokens=4)


# ----------------------------------------------------------------------------- beam search

def test_beam_size_one_equals_greedy():
  """Without a length penalty (with one, a beam of 1 may go on past an EOS that a longer
  output could beat)."""
  model = _model(eos_boost=1.6)
  src = _sources(batch=4)
  tokens, scores = beam_search_decode(model, src, beam_size=1, alpha=0.0,
                                      max_new_tokens=8)
  greedy = greedy_decode(model, src, max_new_tokens=8)
  np.testing.assert_array_equal(np.asarray(tokens)[:, 0], np.asarray(greedy))
  assert tokens.shape == (4, 1, 8) and scores.shape == (4, 1)


@pytest.mark.parametrize('alpha, min_new_tokens', [(0.0, 0), (0.0, 1), (0.6, 1), (2.0, 2)])
def test_beam_search_matches_exhaustive_enumeration(alpha, min_new_tokens):
  """The beam's hypotheses are the model's best sequences of at least `min_new_tokens` tokens
  before EOS. The model (seed, EOS boost) is one under which the empty output is the best
  sequence for some sources: with min_new_tokens=0 the search returns it, with 1 the best
  non-empty one."""
  vocab, max_len = 6, 3  # tokens 1..5; 2..5 continue a sequence
  model = _model(vocab=vocab, eos_boost=3.0, seed=0)
  src = _sources(batch=3, vocab=vocab)
  # Every sequence: ends with EOS before max_len, or has max_len tokens.
  seqs = []
  for n in range(1, max_len + 1):
    for body in itertools.product(range(2, vocab), repeat=n - 1):
      ends = [EOS] if n < max_len else range(1, vocab)
      for last in ends:
        seqs.append(list(body) + [last] + [0] * (max_len - n))
  seqs = np.array(seqs, np.int32)
  allowed = np.array([EOS not in s[:min_new_tokens] for s in seqs])
  # Wide enough to keep every candidate of every step: the search is exhaustive.
  beam = (vocab - 1) * (vocab - 2) ** (max_len - 2)
  tokens, scores = beam_search_decode(model, src, beam_size=beam, alpha=alpha,
                                      max_new_tokens=max_len,
                                      min_new_tokens=min_new_tokens)
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  empty_is_best = []
  for b in range(src.shape[0]):
    lp = _log_probs_full(model, np.repeat(src[b:b + 1], len(seqs), 0), seqs)
    ref = np.array([_score(lp[i], seqs[i], alpha) for i in range(len(seqs))])
    empty_is_best.append(seqs[np.argmax(ref), 0] == EOS)
    ref = np.where(allowed, ref, -np.inf)
    order = np.argsort(-ref)[:beam]
    np.testing.assert_array_equal(tokens[b, 0], seqs[order[0]])  # the best sequence
    np.testing.assert_allclose(scores[b], ref[order], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tokens[b], seqs[order])
  if alpha == 0:  # the case the test is for (a length penalty favours longer outputs)
    assert any(empty_is_best) and not all(empty_is_best)
  # A narrower beam still returns real, correctly scored sequences, none of them too short.
  tokens4, scores4 = beam_search_decode(model, src, beam_size=4, alpha=alpha,
                                        max_new_tokens=max_len,
                                        min_new_tokens=min_new_tokens)
  assert np.all(np.diff(np.asarray(scores4), axis=1) <= 1e-6)
  assert not np.any(np.asarray(tokens4)[..., :min_new_tokens] == EOS)


def test_beam_scores_sorted_and_equal_model_log_probs():
  model = _model(eos_boost=1.5, seed=1)
  src = _sources(batch=3)
  alpha = 0.6
  tokens, scores = beam_search_decode(model, src, beam_size=4, alpha=alpha,
                                      max_new_tokens=7)
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  assert np.isfinite(scores).all()
  assert np.all(np.diff(scores, axis=1) <= 1e-6)
  for b in range(3):
    lp = _log_probs_full(model, np.repeat(src[b:b + 1], 4, 0), tokens[b])
    ref = [_score(lp[j], tokens[b, j], alpha) for j in range(4)]
    np.testing.assert_allclose(scores[b], ref, rtol=1e-4, atol=1e-4)
    assert len({tuple(t) for t in tokens[b]}) == 4  # distinct hypotheses
  # A row's result does not depend on the other rows of its batch (nor on when they finish).
  for b in range(3):
    alone, alone_scores = beam_search_decode(model, src[b:b + 1], beam_size=4,
                                             alpha=alpha, max_new_tokens=7)
    np.testing.assert_array_equal(np.asarray(alone)[0], tokens[b])
    np.testing.assert_allclose(np.asarray(alone_scores)[0], scores[b], rtol=1e-5, atol=1e-5)
  # sequence_log_probs agrees with the hand-made scorer.
  lens = np.where((tokens == EOS).any(-1), np.argmax(tokens == EOS, -1) + 1, tokens.shape[-1])
  lp = np.asarray(sequence_log_probs(model, src, tokens=tokens))
  np.testing.assert_allclose(lp / ((5 + lens) / 6) ** alpha, scores, rtol=1e-4, atol=1e-4)


def test_beam_search_decoder_only_with_prompts():
  model = _model('decoder_only', vocab=12, max_len=16, eos_boost=1.4)
  prompt = np.array([[4, 5, 6], [7, 0, 0]], np.int32)
  tokens, scores = beam_search_decode(model, prompt=prompt, beam_size=3,
                                      alpha=0.6, max_new_tokens=5)
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  lens = np.where((tokens == EOS).any(-1), np.argmax(tokens == EOS, -1) + 1, tokens.shape[-1])
  lp = np.asarray(sequence_log_probs(model, prompt=prompt, tokens=tokens))
  np.testing.assert_allclose(lp / ((5 + lens) / 6) ** 0.6, scores, rtol=1e-4, atol=1e-4)
  alone, _ = beam_search_decode(model, prompt=prompt[1:, :1], beam_size=3,
                                alpha=0.6, max_new_tokens=5)
  np.testing.assert_array_equal(np.asarray(alone)[0], tokens[1])


@pytest.mark.parametrize('case', ['eos', 'no_eos', 'decoder_only_prompts', 'rope_fused'])
def test_beam_search_equals_reference_cache_reordering(case):
  """The hypotheses-as-queries cache layout returns what reordering the caches returns."""
  if case in ('eos', 'no_eos'):
    model = _model(eos_boost=1.5, seed=1)
    kw = {'inputs': _sources(batch=3), 'max_new_tokens': 9, 'beam_size': 4}
    if case == 'no_eos':
      kw.update(eos_id=None, beam_size=3)
  else:
    extra = ({'positional_encoding': 'rope', 'attention_impl': 'xla', 'norm_position': 'pre'}
             if case == 'rope_fused' else {})
    model = _model('decoder_only', vocab=12, max_len=16, eos_boost=1.4, **extra)
    kw = {'prompt': np.array([[4, 5, 6], [7, 0, 0], [0, 0, 0]], np.int32), 'max_new_tokens': 6,
          'beam_size': 3}
  tokens, scores = beam_search_decode(model, alpha=0.6, **kw)
  ref_tokens, ref_scores = beam_search_decode(model, alpha=0.6,
                                              reorder_cache=True, **kw)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens))
  np.testing.assert_allclose(np.asarray(scores), np.asarray(ref_scores), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- sampling

def test_sampling_reproducible_and_top_k():
  model = _model('decoder_only', vocab=20, max_len=24)
  prompt = np.tile(np.array([[5, 6, 7]], np.int32), (16, 1))
  prompt[8:, 1:] = 0  # two prompt lengths
  kw = {'max_new_tokens': 10, 'temperature': 1.0, 'top_k': 3, 'eos_id': None}
  a = np.asarray(sample(model, prompt, rng=jax.random.PRNGKey(0), **kw))
  c = np.asarray(sample(model, prompt, rng=jax.random.PRNGKey(1), **kw))
  # (The same key twice would run one program on the same inputs: the same seed's samples are
  # compared across batches and processes in test_inference and test_decode_cli.)
  assert (a != c).any()
  assert len({tuple(r) for r in a[:8]}) > 1  # it samples, not argmax
  for i in range(16):
    p = [t for t in prompt[i] if t]
    seq = p + a[i].tolist()
    lp = _log_probs_full(model, None, np.array([seq + [3] * (13 - len(seq))]))[0].copy()
    lp[:, 0] = -np.inf
    for t in range(len(p), len(seq)):
      top3 = np.argsort(-lp[t])[:3]
      assert seq[t] in top3, (i, t, seq[t], top3)


def test_sampling_top_p_and_temperature_zero():
  model = _model(eos_boost=1.5)
  src = _sources(batch=4)
  greedy = np.asarray(greedy_decode(model, src, max_new_tokens=6))
  zero_t = np.asarray(sample(model, src, rng=jax.random.PRNGKey(3),
                             max_new_tokens=6, temperature=0.0))
  np.testing.assert_array_equal(greedy, zero_t)
  # A tiny nucleus keeps only the most likely token: greedy again, also for a top_p that is
  # 0 as a float32 on CPU (1e-38: subnormal, flushed), which once kept no token at all.
  for top_p in (1e-6, 1e-38, 1e-40):
    tiny_p = np.asarray(sample(model, inputs=src, rng=jax.random.PRNGKey(3),
                               max_new_tokens=6, top_p=top_p))
    np.testing.assert_array_equal(greedy, tiny_p)


def test_greedy_rope_and_fused_attention_equal_full_forward():
  model = _model('decoder_only', vocab=20, max_len=20, positional_encoding='rope',
                          attention_impl='xla', norm_position='pre')
  prompt = np.array([[5, 6, 7], [9, 0, 0]], np.int32)
  out = np.asarray(greedy_decode(model, prompt=prompt, max_new_tokens=5,
                                 eos_id=None))
  for i, p in enumerate([[5, 6, 7], [9]]):
    np.testing.assert_array_equal(out[i], _greedy_by_full_forward(model, p, 5, 10))


@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_scan_layers_model_decodes_like_the_unrolled_model(kind):
  """Decoding a `scan_layers` model runs it unrolled: same tokens, same beam scores."""
  model = _model(kind, vocab=20, eos_boost=3.0)
  scanned = bind(dataclasses.replace(model.config, scan_layers=True),
                 stack_layer_params(params_of(model)))
  if kind == 'encoder_decoder':
    args, kwargs = (_sources(),), {}
  else:
    args, kwargs = (), {'prompt': np.array([[5, 6, 7], [9, 0, 0]], np.int32)}
  np.testing.assert_array_equal(
      greedy_decode(scanned, *args, max_new_tokens=6, **kwargs),
      greedy_decode(model, *args, max_new_tokens=6, **kwargs))
  got = beam_search_decode(scanned, *args, beam_size=3, alpha=0.6,
                           max_new_tokens=6, **kwargs)
  want = beam_search_decode(model, *args, beam_size=3, alpha=0.6,
                            max_new_tokens=6, **kwargs)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5)


# ----------------------------------------------------------------------------- loop helpers

@pytest.mark.parametrize('beams, vocab', [(4, 1024), (1, 1024), (4, 5), (3, 97)])
def test_best_extensions_are_the_best_over_the_whole_vocabulary_ties_included(beams, vocab):
  """Beam search's candidates (block path for a real vocabulary; 97 is prime: blocks of one
  token; 5 < 2k: NEG_INF fills in) are the top 2k of `alive_lp + log_softmax(logits)` over every
  (beam, token) but pad, ties to the lower beam then token, with log_softmax's values."""
  from autoregressive.strategies.beam import best_extensions  # pylint: disable=import-outside-toplevel
  k, batch = 4, 3
  rng = np.random.RandomState(vocab + beams)
  logits = rng.randint(0, 40, (batch, beams, vocab)).astype(np.float32)  # many ties
  logits[1, :, 1:] = -5.0  # pad (0) is the best token of every beam of sentence 1
  alive_lp = rng.randint(-3, 0, (batch, k)).astype(np.float32)
  alive_lp[2, 1:] = -np.inf  # one live beam
  got = best_extensions(jnp.asarray(logits), jnp.asarray(alive_lp), 2 * k)
  lp = alive_lp[:, :beams, None] + _log_softmax_without_pad(logits)
  lp = lp.at[..., 0].set(-jnp.inf).reshape(batch, -1)
  n = min(2 * k, lp.shape[1])
  values, pos = jax.lax.top_k(lp, n)
  # The same arithmetic, but the backend may sum the exponentials in another order (on GPU
  # one value of 24 differed by 1 ulp); the order and the ties are exact.
  np.testing.assert_allclose(got[0][:, :n], values, rtol=1e-6, atol=0)
  finite = np.isfinite(np.asarray(values))
  np.testing.assert_array_equal(np.asarray(got[1][:, :n])[finite], (pos // vocab)[finite])
  np.testing.assert_array_equal(np.asarray(got[2][:, :n])[finite], (pos % vocab)[finite])
  assert np.all(np.asarray(got[0][:, n:]) == -np.inf)


def test_cache_operations_touch_only_their_caches():
  """model.kv_cache, what the searches do to the cache: `pin` puts a barrier on each
  cross-attention array and nothing else (values unchanged); `grow` pads the self-attention
  caches with empty positions; `select_rows` reorders their rows; neither touches the
  cross-attention caches (one per sentence) or the index."""
  from model.kv_cache import CrossAttentionCache, SelfAttentionCache  # pylint: disable=import-outside-toplevel
  model = _model()
  src = _sources()
  adapter = adapter_of(model)
  cache = adapter.init_cache(model, jax.jit(lambda m, s: m.encode(s))(model, src), src, 3, 4)
  _, cache = jax.jit(adapter.decoder_step)(model, cache, src, np.zeros((3, 1), np.int32))
  jax.tree.map(np.testing.assert_array_equal, cache.pin(), cache)
  jaxpr = jax.make_jaxpr(lambda c: c.pin())(cache)
  barriers = [e for e in jaxpr.eqns if e.primitive.name == 'optimization_barrier']
  crosses = [c for layer in cache.layers for c in layer.values()
             if isinstance(c, CrossAttentionCache)]
  assert crosses and sum(len(e.invars) for e in barriers) == 2 * len(crosses)
  rows = np.array([2, 0, 1])
  grown, selected = cache.grow(6), cache.select_rows(rows)
  assert int(grown.index) == int(selected.index) == 1
  for layer, g, s in zip(cache.layers, grown.layers, selected.layers, strict=True):
    for name, c in layer.items():
      if isinstance(c, CrossAttentionCache):
        jax.tree.map(np.testing.assert_array_equal, (g[name], s[name]), (c, c))
        continue
      assert isinstance(c, SelfAttentionCache) and c.length == 4 and g[name].length == 6
      (k, v), (gk, gv) = c.keys_values(), g[name].keys_values()
      np.testing.assert_array_equal(gk[:, :4], k)
      np.testing.assert_array_equal(gv[:, :4], v)
      assert not np.asarray(gk[:, 4:]).any() and not np.asarray(gv[:, 4:]).any()
      np.testing.assert_array_equal(s[name].key, np.asarray(c.key)[rows])
      np.testing.assert_array_equal(s[name].value, np.asarray(c.value)[rows])


def test_one_new_token_is_the_models_best_first_tokens():
  """Issue 58, cause 7: max_new_tokens=1 (within the documented bounds) crashed beam search
  (its loop was traced with no cache room). The k hypotheses are then the k most likely
  first tokens (EOS excluded by min_new_tokens=1), scored by their log-probabilities; greedy
  decoding gives the first of them."""
  model = _model(vocab=12)
  src = _sources(batch=2, vocab=12)
  tokens, scores = beam_search_decode(model, src, beam_size=3, alpha=0.6,
                                      max_new_tokens=1, min_new_tokens=1)
  first = _log_probs_full(model, src, np.full((2, 1), 3, np.int32))[:, 0].copy()
  first[:, EOS] = -np.inf
  best = np.argsort(-first, axis=1)[:, :3]
  np.testing.assert_array_equal(np.asarray(tokens)[:, :, 0], best)
  np.testing.assert_allclose(scores, np.take_along_axis(first, best, 1), rtol=1e-4, atol=1e-5)
  greedy = greedy_decode(model, src, max_new_tokens=1)
  np.testing.assert_array_equal(np.asarray(greedy)[:, 0], best[:, 0])
