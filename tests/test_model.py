"""The Linen models: shapes, masks end to end, packing, KV cache, configs, presets."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import wmt14_base, wmt14_big
from model import ConfigError, build_model, layers

TINY = dict(kind='encoder_decoder', vocab_size=40, num_encoder_layers=2, num_decoder_layers=2,
            d_model=32, num_heads=4, d_ff=64, dropout_rate=0.1, max_len=32)


def tokens(seed, shape, low=3, high=40):
  return jnp.asarray(np.random.RandomState(seed).randint(low, high, shape), jnp.int32)


def init(module, *args, **kwargs):
  """`module.init` under jit: one compile instead of an op-by-op run of every initializer."""
  return jax.jit(functools.partial(module.init, **kwargs))(jax.random.key(0), *args)


def apply(module, **static):
  """`module.apply` (with `static` keyword arguments) under jit: one compile per shape instead
  of an op-by-op run, each op compiled on its own."""
  return jax.jit(functools.partial(module.apply, **static))


@pytest.fixture(scope='module')
def encdec():
  module = build_model(TINY)
  src, tgt = tokens(0, (2, 7)), tokens(1, (2, 9))
  return module, init(module, src, tgt)


@pytest.fixture(scope='module')
def lm():
  module = build_model({**TINY, 'kind': 'decoder_only'})
  return module, init(module, tokens(0, (2, 9)))


def test_shapes(encdec, lm):
  module, variables = encdec
  assert apply(module)(variables, tokens(2, (3, 5)), tokens(3, (3, 6))).shape == (3, 6, 40)
  module, variables = lm
  assert apply(module)(variables, tokens(2, (3, 6))).shape == (3, 6, 40)
  enc_only = build_model({**TINY, 'kind': 'encoder_only'})
  out = apply(enc_only)(init(enc_only, tokens(0, (2, 5))), tokens(0, (2, 5)))
  assert out.shape == (2, 5, 32)


def test_decoder_is_causal(encdec):
  module, variables = encdec
  src, tgt = tokens(4, (2, 7)), tokens(5, (2, 9))
  run = apply(module)
  base = run(variables, src, tgt)
  for t in range(tgt.shape[1]):
    changed = tgt.at[:, t:].set(tokens(6 + t, (2, tgt.shape[1] - t)))
    out = run(variables, src, changed)
    # logits[:, t] predicts targets[:, t] from targets[:, :t]: positions <= t are unchanged.
    np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-5)
    if t + 1 < tgt.shape[1]:
      assert not np.allclose(out[:, t + 1:], base[:, t + 1:])


def test_decoder_only_is_causal(lm):
  module, variables = lm
  x = tokens(7, (2, 9))
  run = apply(module)
  base = run(variables, x)
  for t in range(9):
    out = run(variables, x.at[:, t:].set(tokens(8 + t, (2, 9 - t))))
    np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-5)


def test_padding_invariance(encdec, lm):
  module, variables = encdec
  src, tgt = tokens(9, (2, 6)), tokens(10, (2, 5))
  base = apply(module)(variables, src, tgt)
  padded_src = jnp.pad(src, ((0, 0), (0, 4)))
  padded_tgt = jnp.pad(tgt, ((0, 0), (0, 3)))
  out = apply(module)(variables, padded_src, padded_tgt)
  np.testing.assert_allclose(out[:, :5], base, atol=1e-5)
  module, variables = lm
  out = apply(module)(variables, jnp.pad(tgt, ((0, 0), (0, 3))))
  np.testing.assert_allclose(out[:, :5], apply(module)(variables, tgt), atol=1e-5)


def test_encoder_only_is_bidirectional():
  module = build_model({**TINY, 'kind': 'encoder_only'})
  x = tokens(11, (1, 6))
  variables = init(module, x)
  base = apply(module)(variables, x)
  out = apply(module)(variables, x.at[:, -1].set((x[0, -1] + 1) % 37 + 3))
  assert not np.allclose(out[:, 0], base[:, 0])


@pytest.mark.parametrize('positional_encoding', ['sinusoidal', 'learned', 'rope'])
def test_packed_examples_equal_examples_alone(positional_encoding):
  """Two examples packed in one row give the same logits as each run alone."""
  module = build_model({**TINY, 'positional_encoding': positional_encoding})
  src_a, tgt_a = tokens(12, (1, 4)), tokens(13, (1, 5))
  src_b, tgt_b = tokens(14, (1, 3)), tokens(15, (1, 3))
  variables = init(module, src_a, tgt_a)
  alone_a = apply(module)(variables, src_a, tgt_a)
  alone_b = apply(module)(variables, src_b, tgt_b)
  packed = apply(module)(
      variables, jnp.concatenate([src_a, src_b, jnp.zeros((1, 2), jnp.int32)], 1),
      jnp.concatenate([tgt_a, tgt_b, jnp.zeros((1, 1), jnp.int32)], 1),
      inputs_segmentation=jnp.array([[1] * 4 + [2] * 3 + [0] * 2]),
      inputs_position=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]]),
      targets_segmentation=jnp.array([[1] * 5 + [2] * 3 + [0]]),
      targets_position=jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]]))
  np.testing.assert_allclose(packed[:, :5], alone_a, atol=1e-5)
  np.testing.assert_allclose(packed[:, 5:8], alone_b, atol=1e-5)

  lm_module = build_model({**TINY, 'kind': 'decoder_only',
                           'positional_encoding': positional_encoding})
  lm_vars = init(lm_module, tgt_a)
  packed_lm = apply(lm_module)(lm_vars, jnp.concatenate([tgt_a, tgt_b], 1),
                               segment_ids=jnp.array([[1] * 5 + [2] * 3]),
                               positions=jnp.array([[0, 1, 2, 3, 4, 0, 1, 2]]))
  np.testing.assert_allclose(packed_lm[:, 5:], apply(lm_module)(lm_vars, tgt_b), atol=1e-5)


def zero_cache(module, *args, **kwargs):
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *args, use_cache=True,
                                              **kwargs))['cache']
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


@pytest.mark.parametrize('positional_encoding', ['sinusoidal', 'learned', 'rope'])
@pytest.mark.parametrize('norm_position', ['post', 'pre'])
def test_kv_cache_matches_full_forward_encoder_decoder(positional_encoding, norm_position):
  module = build_model({**TINY, 'positional_encoding': positional_encoding,
                        'norm_position': norm_position})
  src = tokens(16, (2, 7)).at[1, 4:].set(0)
  tgt = tokens(17, (2, 8))
  variables = init(module, src, tgt)
  full = module.apply(variables, src, tgt)
  encoded = module.apply(variables, src, method=module.encode)
  cache = zero_cache(module, encoded, src, tgt, method=module.decode)
  decoder_inputs = jnp.pad(tgt, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for t in range(tgt.shape[1]):
    logits, mutated = module.apply({'params': variables['params'], 'cache': cache}, encoded, src,
                                   decoder_inputs[:, t:t + 1], use_cache=True,
                                   method=module.decode, mutable=['cache'])
    cache = mutated['cache']
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-4)


@pytest.mark.parametrize('positional_encoding', ['sinusoidal', 'learned', 'rope'])
def test_kv_cache_matches_full_forward_decoder_only(positional_encoding):
  module = build_model({**TINY, 'kind': 'decoder_only',
                        'positional_encoding': positional_encoding})
  x = tokens(18, (2, 10))
  variables = init(module, x)
  full = apply(module)(variables, x)
  cache = zero_cache(module, x)
  inputs = jnp.pad(x, ((0, 0), (1, 0)))[:, :-1]
  step = apply(module, use_cache=True, mutable=['cache'])
  # A 4-token prefill, then one token at a time.
  logits, mutated = step({'params': variables['params'], 'cache': cache}, inputs[:, :4])
  steps = [logits]
  cache = mutated['cache']
  for t in range(4, 10):
    logits, mutated = step({'params': variables['params'], 'cache': cache}, inputs[:, t:t + 1])
    cache = mutated['cache']
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-4)


def one_train_step(module, variables, args, targets):
  params = variables['params']
  optimizer = optax.adam(1e-3)

  def loss_fn(params):
    logits = module.apply({'params': params}, *args, deterministic=False,
                          rngs={'dropout': jax.random.key(1)})
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  @jax.jit
  def step(params):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    return loss, grads, loss_fn(optax.apply_updates(params, updates))

  return step(params)


# Each positional encoding and each norm position, for both decoder kinds.
@pytest.mark.parametrize('kind, positional_encoding, norm_position', [
    ('encoder_decoder', 'sinusoidal', 'post'), ('encoder_decoder', 'learned', 'pre'),
    ('encoder_decoder', 'rope', 'pre'), ('decoder_only', 'sinusoidal', 'pre'),
    ('decoder_only', 'learned', 'post'), ('decoder_only', 'rope', 'post')])
def test_variants_train_one_step_without_nan(kind, positional_encoding, norm_position):
  module = build_model({**TINY, 'kind': kind, 'positional_encoding': positional_encoding,
                        'norm_position': norm_position, 'attention_dropout_rate': 0.1,
                        'num_encoder_layers': 1, 'num_decoder_layers': 1})
  src, tgt = tokens(19, (2, 6)), tokens(20, (2, 7))
  args = (src, tgt) if kind == 'encoder_decoder' else (tgt,)
  variables = init(module, *args)
  loss, grads, new_loss = one_train_step(module, variables, args, tgt)
  assert np.isfinite(loss) and np.isfinite(new_loss)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_bfloat16_compute_keeps_float32_params():
  module = build_model({**TINY, 'dtype': 'bfloat16'})
  src, tgt = tokens(21, (2, 6)), tokens(22, (2, 7))
  variables = init(module, src, tgt)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables['params']))
  logits = apply(module)(variables, src, tgt)
  assert logits.dtype == jnp.float32
  ref = apply(build_model(TINY))(variables, src, tgt)
  np.testing.assert_allclose(logits, ref, atol=0.15)


def test_options_equal_reference_path():
  """The fused attention path and remat give the reference path's logits and gradients."""
  src, tgt = tokens(23, (2, 6)), tokens(24, (2, 7))
  reference = build_model(TINY)
  variables = init(reference, src, tgt)
  ref_logits = jax.jit(reference.apply)(variables, src, tgt)  # jit: one compile, not op by op
  ref_grads = jax.jit(jax.grad(lambda p: reference.apply({'params': p}, src, tgt).sum()))(
      variables['params'])
  for option in ({'attention_impl': 'xla'}, {'remat': True}):
    module = build_model({**TINY, **option})
    np.testing.assert_allclose(jax.jit(module.apply)(variables, src, tgt), ref_logits, atol=1e-5)
    grads = jax.jit(jax.grad(lambda p, m=module: m.apply({'params': p}, src, tgt).sum()))(
        variables['params'])
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_unshared_embeddings_and_separate_output_layer():
  module = build_model({**TINY, 'share_embeddings': False, 'logits_via_embedding': False})
  src, tgt = tokens(25, (1, 4)), tokens(26, (1, 4))
  params = init(module, src, tgt)['params']
  assert 'target_embed' in params and 'logits' in params['decoder']
  shared = init(build_model(TINY), src, tgt)['params']
  assert 'target_embed' not in shared and 'logits' not in shared['decoder']


def count_params(config):
  module = build_model(config.model)
  x = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), x, x))
  return sum(p.size for p in jax.tree.leaves(shapes['params']))


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
@pytest.mark.parametrize('features,axis', [((3, 4, 8), -1), ((16,), (-2, -1)), ((7,), -1)])
def test_dense_equals_flax_dense_general(features, axis, matmul):
  """`layers.Dense` has nn.DenseGeneral's parameters (same init) and output, with its
  kernel flattened to one 2-D matmul (the XLA:CPU choice) or contracted as it is."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 4, 8))
  reference = nn.DenseGeneral(features, axis=axis, kernel_init=layers.dense_init)
  ours = layers.Dense(features, 1 if isinstance(axis, int) else len(axis), matmul=matmul)
  params = reference.init(jax.random.PRNGKey(1), x)
  ours_params = ours.init(jax.random.PRNGKey(1), x)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ours_params), strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(ours.apply(params, x), reference.apply(params, x), rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_scan_layers_equals_unrolled_layers(kind):
  """`scan_layers` (nn.scan, params stacked [layers, ...]) computes what the unrolled layers
  compute with the same weights: logits and gradients, with and without remat."""
  from model import transformer  # pylint: disable=import-outside-toplevel
  cfg = {**TINY, 'kind': kind, 'num_decoder_layers': 3}
  args = ((tokens(27, (2, 6)), tokens(28, (2, 7))) if kind == 'encoder_decoder'
          else (tokens(28, (2, 7)),))
  unrolled = build_model(cfg)
  params = init(unrolled, *args)['params']
  stacked = transformer.stack_layer_params(params)
  assert 'layer_0' not in stacked['decoder'] and 'layers' in stacked['decoder']
  assert stacked['decoder']['layers']['ffn']['wi']['kernel'].shape == (3, 32, 64)
  restored = transformer.unstack_layer_params(stacked)
  assert jax.tree.structure(restored) == jax.tree.structure(params)
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), restored, params)))

  def loss(module, p):
    return jnp.sum(module.apply({'params': p}, *args) ** 2) * 1e-3

  ref_logits = jax.jit(unrolled.apply)({'params': params}, *args)  # jit: one compile, not op by op
  ref_grads = transformer.stack_layer_params(
      jax.jit(jax.grad(functools.partial(loss, unrolled)))(params))
  for option in ({'scan_layers': True}, {'scan_layers': True, 'remat': True}):
    scanned = build_model({**cfg, **option})
    # Its own init has the stacked layout (and the shapes: eval_shape runs nothing).
    own = jax.eval_shape(functools.partial(init, scanned, *args))['params']
    assert jax.tree.map(np.shape, own) == jax.tree.map(np.shape, stacked)
    np.testing.assert_allclose(jax.jit(scanned.apply)({'params': stacked}, *args), ref_logits,
                               atol=1e-5)
    grads = jax.jit(jax.grad(functools.partial(loss, scanned)))(stacked)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
  # Dropout draws independent masks in each scanned layer (split RNGs), reproducibly.
  scanned = build_model({**cfg, 'scan_layers': True})

  @jax.jit
  def run(seed):
    return scanned.apply({'params': stacked}, *args, deterministic=False,
                         rngs={'dropout': jax.random.key(seed)})

  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))


def test_dropout_rng_impl_option():
  """`dropout_rng_impl='threefry'` (jax.random bits) and the default hashed bits: both drop about
  `rate` of the activations, reproducibly per key, with different masks; eval is unaffected."""
  src, tgt = tokens(29, (4, 8)), tokens(30, (4, 8))
  cfg = {**TINY, 'dropout_rate': 0.3, 'attention_dropout_rate': 0.3}
  variables = init(build_model(cfg), src, tgt)
  outs = {}
  for rng_impl in ('hash', 'threefry'):
    module = build_model({**cfg, 'dropout_rng_impl': rng_impl})

    def run(seed, module=module):
      return module.apply(variables, src, tgt, deterministic=False,
                          rngs={'dropout': jax.random.key(seed)})

    np.testing.assert_array_equal(run(1), run(1))
    outs[rng_impl] = run(1)
    np.testing.assert_array_equal(module.apply(variables, src, tgt),
                                  build_model(cfg).apply(variables, src, tgt))
  assert not np.allclose(outs['hash'], outs['threefry'])
  with pytest.raises(ConfigError, match="dropout_rng_impl='philox'"):
    build_model({**TINY, 'dropout_rng_impl': 'philox'})
  with pytest.raises(ConfigError, match=r"unknown field\(s\) \['dropout_rng'\]"):  # 0.2.0
    build_model({**cfg, 'dropout_rng': 'threefry'})
