"""The NNX models: shapes, masks end to end, packing, KV cache, configs, presets."""


import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import wmt14_base, wmt14_big
from model import ConfigError, bind, build_model, layers, params_of, stacks
from model.build import param_shapes
from model.config import ModelConfig

TINY = dict(kind='encoder_decoder', vocab_size=40, num_encoder_layers=2, num_decoder_layers=2,
            d_model=32, num_heads=4, d_ff=64, dropout_rate=0.1, max_len=32)


def tokens(seed, shape, low=3, high=40):
  return jnp.asarray(np.random.RandomState(seed).randint(low, high, shape), jnp.int32)


@functools.partial(jax.jit, static_argnames='deterministic')
def call(model, *args, **kwargs):
  """`model(*args, **kwargs)` under jit: one compile per model structure and shapes instead
  of an op-by-op run."""
  return model(*args, **kwargs)


@functools.partial(jax.jit, static_argnums=1)
def call_method(model, name: str, *args):
  """`model.NAME(*args)` under jit (as `call`)."""
  return getattr(model, name)(*args)


@pytest.fixture(scope='module')
def encdec():
  return build_model(TINY)


@pytest.fixture(scope='module')
def lm():
  return build_model({**TINY, 'kind': 'decoder_only'})


def test_shapes(encdec, lm):
  assert call(encdec, tokens(2, (3, 5)), tokens(3, (3, 6))).shape == (3, 6, 40)
  assert call(lm, tokens(2, (3, 6))).shape == (3, 6, 40)
  enc_only = build_model({**TINY, 'kind': 'encoder_only'})
  assert call(enc_only, tokens(0, (2, 5))).shape == (2, 5, 32)


def test_decoder_is_causal(encdec):
  src, tgt = tokens(4, (2, 7)), tokens(5, (2, 9))
  base = call(encdec, src, tgt)
  for t in range(tgt.shape[1]):
    changed = tgt.at[:, t:].set(tokens(6 + t, (2, tgt.shape[1] - t)))
    out = call(encdec, src, changed)
    # logits[:, t] predicts targets[:, t] from targets[:, :t]: positions <= t are unchanged.
    np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-5)
    if t + 1 < tgt.shape[1]:
      assert not np.allclose(out[:, t + 1:], base[:, t + 1:])


def test_decoder_only_is_causal(lm):
  x = tokens(7, (2, 9))
  base = call(lm, x)
  for t in range(9):
    out = call(lm, x.at[:, t:].set(tokens(8 + t, (2, 9 - t))))
    np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-5)


def test_padding_invariance(encdec, lm):
  src, tgt = tokens(9, (2, 6)), tokens(10, (2, 5))
  base = call(encdec, src, tgt)
  out = call(encdec, jnp.pad(src, ((0, 0), (0, 4))), jnp.pad(tgt, ((0, 0), (0, 3))))
  np.testing.assert_allclose(out[:, :5], base, atol=1e-5)
  out = call(lm, jnp.pad(tgt, ((0, 0), (0, 3))))
  np.testing.assert_allclose(out[:, :5], call(lm, tgt), atol=1e-5)


def test_encoder_only_is_bidirectional():
  module = build_model({**TINY, 'kind': 'encoder_only'})
  x = tokens(11, (1, 6))
  base = call(module, x)
  out = call(module, x.at[:, -1].set((x[0, -1] + 1) % 37 + 3))
  assert not np.allclose(out[:, 0], base[:, 0])


@pytest.mark.parametrize('positional_encoding', ['sinusoidal', 'learned', 'rope'])
def test_packed_examples_equal_examples_alone(positional_encoding):
  """Two examples packed in one row give the same logits as each run alone."""
  module = build_model({**TINY, 'positional_encoding': positional_encoding})
  src_a, tgt_a = tokens(12, (1, 4)), tokens(13, (1, 5))
  src_b, tgt_b = tokens(14, (1, 3)), tokens(15, (1, 3))
  alone_a = call(module, src_a, tgt_a)
  alone_b = call(module, src_b, tgt_b)
  packed = call(
      module,
      jnp.concatenate([src_a, src_b, jnp.zeros((1, 2), jnp.int32)], 1),
      jnp.concatenate([tgt_a, tgt_b, jnp.zeros((1, 1), jnp.int32)], 1),
      inputs_segmentation=jnp.array([[1] * 4 + [2] * 3 + [0] * 2]),
      inputs_position=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]]),
      targets_segmentation=jnp.array([[1] * 5 + [2] * 3 + [0]]),
      targets_position=jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]]))
  np.testing.assert_allclose(packed[:, :5], alone_a, atol=1e-5)
  np.testing.assert_allclose(packed[:, 5:8], alone_b, atol=1e-5)

  lm_module = build_model({**TINY, 'kind': 'decoder_only',
                           'positional_encoding': positional_encoding})
  packed_lm = call(lm_module, jnp.concatenate([tgt_a, tgt_b], 1),
                   segment_ids=jnp.array([[1] * 5 + [2] * 3]),
                   positions=jnp.array([[0, 1, 2, 3, 4, 0, 1, 2]]))
  np.testing.assert_allclose(packed_lm[:, 5:], call(lm_module, tgt_b), atol=1e-5)


# Each positional encoding (where positions enter) and each norm position once: the norm
# acts on a step's own input, not on what the cache keeps (a program less per pair).
@pytest.mark.parametrize('positional_encoding, norm_position', [
    ('sinusoidal', 'post'), ('learned', 'pre'), ('rope', 'post')])
def test_kv_cache_matches_full_forward_encoder_decoder(positional_encoding, norm_position):
  assert_cache_equals_full_forward(build_model({**TINY, 'positional_encoding': positional_encoding,
                                                'norm_position': norm_position}))


def assert_cache_equals_full_forward(module):
  """An encoder-decoder's cached steps give the logits of its full teacher-forced pass."""
  src = tokens(16, (2, 7)).at[1, 4:].set(0)
  tgt = tokens(17, (2, 8))
  full = call(module, src, tgt)
  cache = module.init_cache(2, tgt.shape[1], call_method(module, 'encode', src), src)
  decoder_inputs = jnp.pad(tgt, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for t in range(tgt.shape[1]):
    logits, cache = call_method(module, 'step', cache, src, decoder_inputs[:, t:t + 1])
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-4)


@pytest.mark.parametrize('positional_encoding, norm_position', [
    ('sinusoidal', 'post'), ('learned', 'pre'), ('rope', 'post')])
def test_kv_cache_matches_full_forward_decoder_only(positional_encoding, norm_position):
  module = build_model({**TINY, 'kind': 'decoder_only', 'norm_position': norm_position,
                        'positional_encoding': positional_encoding})
  x = tokens(18, (2, 10))
  full = call(module, x)
  cache = module.init_cache(2, 10)
  inputs = jnp.pad(x, ((0, 0), (1, 0)))[:, :-1]
  # A 4-token prefill, then one token at a time.
  logits, cache = call_method(module, 'step', cache, None, inputs[:, :4])
  steps = [logits]
  for t in range(4, 10):
    logits, cache = call_method(module, 'step', cache, None, inputs[:, t:t + 1])
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-4)


def one_train_step(module, args, targets):
  graphdef, params = nnx.split(module, nnx.Param)
  optimizer = optax.adam(1e-3)

  def loss_fn(params):
    logits = nnx.merge(graphdef, params)(*args, deterministic=False,
                                         dropout_rng=jax.random.key(1))
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  @jax.jit
  def step(params):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    return loss, grads, loss_fn(optax.apply_updates(params, updates))

  return step(params)


# Each positional encoding, each norm position and each decoder kind; RoPE (rotated inside
# self-attention, not added to the embeddings) in both kinds.
@pytest.mark.parametrize('kind, positional_encoding, norm_position', [
    ('encoder_decoder', 'sinusoidal', 'post'), ('encoder_decoder', 'rope', 'pre'),
    ('decoder_only', 'learned', 'pre'), ('decoder_only', 'rope', 'post')])
def test_variants_train_one_step_without_nan(kind, positional_encoding, norm_position):
  module = build_model({**TINY, 'kind': kind, 'positional_encoding': positional_encoding,
                        'norm_position': norm_position, 'attention_dropout_rate': 0.1,
                        'num_encoder_layers': 1, 'num_decoder_layers': 1})
  src, tgt = tokens(19, (2, 6)), tokens(20, (2, 7))
  args = (src, tgt) if kind == 'encoder_decoder' else (tgt,)
  loss, grads, new_loss = one_train_step(module, args, tgt)
  assert np.isfinite(loss) and np.isfinite(new_loss)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert new_loss < loss  # the step learned: the same batch, the same dropout masks
  # The step trains: the same batch under the same dropout mask has a lower loss after it.
  assert new_loss < loss, (loss, new_loss)


def with_params(config, params):
  """`config`'s model holding `params` (another model's, same shapes)."""
  return bind(ModelConfig.from_config(config), params)


def test_bfloat16_compute_keeps_float32_params():
  module = build_model({**TINY, 'dtype': 'bfloat16'})
  src, tgt = tokens(21, (2, 6)), tokens(22, (2, 7))
  params = params_of(module)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  logits = call(module, src, tgt)
  assert logits.dtype == jnp.float32
  ref = call(with_params(TINY, params), src, tgt)
  np.testing.assert_allclose(logits, ref, atol=0.15)


def _logits_and_grads(module, src, tgt):
  graphdef, params = nnx.split(module, nnx.Param)
  def total(p):
    return nnx.merge(graphdef, p)(src, tgt).sum()
  return call(module, src, tgt), jax.jit(jax.grad(total))(params)


def test_options_equal_reference_path():
  """The fused attention path and remat give the reference path's logits and gradients."""
  src, tgt = tokens(23, (2, 6)), tokens(24, (2, 7))
  reference = build_model(TINY)
  ref_logits, ref_grads = _logits_and_grads(reference, src, tgt)
  for option in ({'attention_impl': 'xla'}, {'remat': True}):
    logits, grads = _logits_and_grads(with_params({**TINY, **option}, params_of(reference)),
                                      src, tgt)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_unshared_embeddings_and_separate_output_layer():
  params = param_shapes(ModelConfig(**{**TINY, 'share_embeddings': False,
                                       'logits_via_embedding': False}))
  assert 'target_embed' in params and 'logits' in params['decoder']
  shared = param_shapes(ModelConfig(**TINY))
  assert 'target_embed' not in shared and 'logits' not in shared['decoder']


def count_params(config):
  return sum(p.size for p in jax.tree.leaves(param_shapes(ModelConfig.from_config(
      config.model))))


def test_paper_parameter_counts():
  """Table 3: base ~65M, big ~213M (shared 37000 vocabulary, tied output)."""
  base = count_params(wmt14_base.get_config())
  big = count_params(wmt14_big.get_config())
  assert abs(base - 65e6) / 65e6 < 0.04, base  # 63.1M: see README for the count
  assert abs(big - 213e6) / 213e6 < 0.02, big  # 214.2M


@pytest.mark.parametrize('field, value, message', [
    ('d_model', 30, 'd_model=30 is not divisible by config.model.num_heads=4'),
    ('kind', 'rnn', "config.model.kind='rnn' is not one of"),
    ('norm_position', 'middle', 'config.model.norm_position'),
    ('positional_encoding', 'alibi', 'config.model.positional_encoding'),
    ('d_ff', 0, 'config.model.d_ff=0 must be a positive integer'),
    ('num_heads', -2, 'config.model.num_heads=-2 must be a positive integer'),
    ('num_decoder_layers', 0, 'config.model.num_decoder_layers=0'),
    ('dropout_rate', 1.0, r'config.model.dropout_rate=1.0 must be in \[0, 1\)'),
    ('attention_dropout_rate', -0.1, 'config.model.attention_dropout_rate'),
    ('dtype', 'float16', 'config.model.dtype'),
])
def test_bad_config_names_the_field(field, value, message):
  with pytest.raises(ConfigError, match=message):
    build_model({**TINY, field: value})


def test_unknown_model_field():
  with pytest.raises(ConfigError, match='unknown field'):
    build_model({**TINY, 'num_layers': 3})


def test_logits_via_embedding_gradient_equals_autodiff():
  from model.layers import logits_via_embedding
  rng = np.random.RandomState(27)
  x = jnp.asarray(rng.randn(2, 3, 8), jnp.float32)
  embedding = jnp.asarray(rng.randn(11, 8), jnp.float32)
  cotangent = jnp.asarray(rng.randn(2, 3, 11), jnp.float32)

  def plain(x, e):
    return jnp.einsum('bld,vd->blv', x, e)

  np.testing.assert_allclose(logits_via_embedding(x, embedding), plain(x, embedding), rtol=1e-6)
  ours = jax.vjp(logits_via_embedding, x, embedding)[1](cotangent)
  reference = jax.vjp(plain, x, embedding)[1](cotangent)
  for a, b in zip(ours, reference, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('matmul', ['flat', 'general'])
@pytest.mark.parametrize('inputs,features', [(8, (3, 4, 8)), ((4, 8), (16,)), (8, (7,))])
def test_dense_equals_tensordot(inputs, features, matmul):
  """`layers.Dense` contracts x's last axes with its kernel `[*inputs, *features]` (flattened
  to one 2-D matmul, the XLA:CPU choice, or as it is) and adds the bias; Glorot uniform over
  the flattened fan-in/out."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 4, 8))
  names = ('a', 'b', 'c', 'd')[:len(np.atleast_1d(inputs)) + len(features)]
  dense = layers.Dense(inputs, features, names, matmul=matmul, rngs=nnx.Rngs(1))
  dense.bias[...] = jax.random.normal(jax.random.PRNGKey(2), dense.bias.shape)
  n = len(np.atleast_1d(inputs))
  expected = jnp.tensordot(x, dense.kernel[...], axes=n) + dense.bias[...]
  np.testing.assert_allclose(dense(x), expected, rtol=1e-5, atol=1e-5)
  fan_in, fan_out = int(np.prod(inputs)), int(np.prod(features))
  limit = np.sqrt(6 / (fan_in + fan_out))
  assert float(jnp.max(jnp.abs(dense.kernel[...]))) <= limit
  assert dense.kernel.get_metadata()['axes'] == names


@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_scan_layers_equals_unrolled_layers(kind):
  """`scan_layers` (lax.scan, params stacked [layers, ...]) computes what the unrolled layers
  compute with the same weights: logits and gradients, with and without remat, and the same
  dropout masks (a layer's dropout key depends on its index only)."""
  cfg = {**TINY, 'kind': kind, 'num_decoder_layers': 3}
  args = ((tokens(27, (2, 6)), tokens(28, (2, 7))) if kind == 'encoder_decoder'
          else (tokens(28, (2, 7)),))
  unrolled = build_model(cfg)
  params = params_of(unrolled)
  stacked = stacks.stack_layer_params(params)
  assert set(stacked['decoder']['layers']) == {'self_attention', 'self_attention_norm', 'ffn',
                                               'ffn_norm'} | ({'cross_attention',
                                                               'cross_attention_norm'}
                                                              if kind == 'encoder_decoder'
                                                              else set())
  assert stacked['decoder']['layers']['ffn']['wi']['kernel'].shape == (3, 32, 64)
  restored = stacks.unstack_layer_params(stacked)
  assert jax.tree.structure(restored) == jax.tree.structure(params)
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), restored, params)))

  def loss(module):
    graphdef, p = nnx.split(module, nnx.Param)
    return jax.jit(jax.value_and_grad(
        lambda p: jnp.sum(nnx.merge(graphdef, p)(*args) ** 2) * 1e-3))(p)

  ref_loss, ref_grads = loss(unrolled)
  ref_grads = stacks.stack_layer_params(ref_grads)
  # remat inside the scan: one wrapper for every stack (stacks.py), checked on the decoder-only
  # model (the encoder-decoder's gradient program with it was its slowest compile).
  options = [{'scan_layers': True}] + ([{'scan_layers': True, 'remat': True}]
                                       if kind == 'decoder_only' else [])
  for option in options:
    config = {**cfg, **option}
    # Its own init has the stacked layout (and the shapes: eval_shape runs nothing).
    own = param_shapes(ModelConfig(**config))
    assert jax.tree.map(np.shape, own) == jax.tree.map(np.shape, stacked)
    scanned = with_params(config, stacked)
    value, grads = loss(scanned)
    np.testing.assert_allclose(value, ref_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
  scanned = with_params({**cfg, 'scan_layers': True}, stacked)

  def run(module, seed):
    return call(module, *args, deterministic=False, dropout_rng=jax.random.key(seed))

  np.testing.assert_allclose(run(scanned, 1), run(unrolled, 1), atol=1e-5)
  assert not np.allclose(run(scanned, 1), run(scanned, 2))


def test_dropout_rng_impl_option():
  """`dropout_rng_impl='threefry'` (jax.random bits) and the default hashed bits: both drop about
  `rate` of the activations, reproducibly per key, with different masks; eval is unaffected."""
  src, tgt = tokens(29, (4, 8)), tokens(30, (4, 8))
  cfg = {**TINY, 'dropout_rate': 0.3, 'attention_dropout_rate': 0.3}
  params = params_of(build_model(cfg))
  outs = {}
  for rng_impl in ('hash', 'threefry'):
    module = with_params({**cfg, 'dropout_rng_impl': rng_impl}, params)

    def run(seed, module=module):
      return call(module, src, tgt, deterministic=False, dropout_rng=jax.random.key(seed))

    outs[rng_impl] = run(1)
    assert not np.allclose(outs[rng_impl], run(2))  # the key decides the mask
  # Eval is unaffected ('hash' is cfg's own default: comparing it would run one program twice).
  np.testing.assert_array_equal(call(module, src, tgt), call(with_params(cfg, params), src, tgt))
  assert not np.allclose(outs['hash'], outs['threefry'])
  with pytest.raises(ConfigError, match="dropout_rng_impl='philox'"):
    build_model({**TINY, 'dropout_rng_impl': 'philox'})
  with pytest.raises(ConfigError, match=r"unknown field\(s\) \['dropout_rng'\]"):  # 0.2.0
    build_model({**cfg, 'dropout_rng': 'threefry'})
