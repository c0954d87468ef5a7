"""The fast attention paths against the reference `dot_product_attention`.

'chunked' (memory-efficient, every backend) is tested here on CPU: values and gradients for
every mask kind, dropout, bfloat16, and its compiled memory at length 8192. 'cudnn' needs an
NVIDIA GPU: its equality tests are skipped elsewhere; its refusals are tested everywhere.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import ConfigError, ModelConfig, attention as attn, bind, build_model, params_of
from model.chunked_attention import hashed_bits_block

ON_GPU = jax.default_backend() == 'gpu'
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="cuDNN fused attention needs an NVIDIA GPU "
                               f"(backend here: {jax.default_backend()})")

B, T, S, H, D = 2, 37, 45, 3, 8  # lengths not divisible by the block size (16)


def arrays(seed, q_len=T, kv_len=S, dtype=jnp.float32):
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(B, q_len, H, D), dtype)
  k = jnp.asarray(rng.randn(B, kv_len, H, D), dtype)
  v = jnp.asarray(rng.randn(B, kv_len, H, D + 2), dtype)
  return q, k, v


def masks(kind, q_len, kv_len):
  """(mask for the chunked path, the same mask as a dense array) of one kind."""
  rng = np.random.RandomState(len(kind))
  q_valid = jnp.arange(q_len)[None] < jnp.array([[q_len], [q_len - 9]])
  k_valid = jnp.arange(kv_len)[None] < jnp.array([[kv_len], [kv_len - 20]])
  q_seg = jnp.asarray(np.sort(rng.randint(1, 4, (B, q_len)), axis=1))
  k_seg = jnp.asarray(np.sort(rng.randint(1, 4, (B, kv_len)), axis=1))
  factored = {
      'none': None,
      'causal': attn.FactoredMask(causal=True),
      'padding': attn.FactoredMask(query_valid=q_valid, key_valid=k_valid),
      'segment': attn.FactoredMask(query_segment_ids=q_seg, key_segment_ids=k_seg),
      'combined': attn.FactoredMask(True, q_valid, k_valid, q_seg, k_seg),
      # Row 1's keys are all padding: every one of its query rows is fully masked.
      'fully_masked_rows': attn.FactoredMask(key_valid=k_valid.at[1].set(False)),
  }
  if kind == 'dense':
    dense = jnp.asarray(rng.rand(B, 1, q_len, kv_len) > 0.6).at[0, 0, :5].set(False)
    return dense, dense
  mask = factored[kind]
  return mask, attn.dense_mask(mask, q_len, kv_len)


MASK_KINDS = ['none', 'causal', 'padding', 'segment', 'combined', 'fully_masked_rows', 'dense']


def value_and_grads(fn, q, k, v, bias, cotangent):
  """fn's output and the gradients of <output, cotangent> w.r.t. q, k, v (and bias)."""
  def loss(q, k, v, bias):
    return jnp.sum(fn(q, k, v, bias).astype(jnp.float32) * cotangent)
  argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  return jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums)(*a)))(q, k, v, bias)


def assert_close(a, b, tol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               atol=tol, rtol=tol)


def assert_no_less_exact(a, b, exact):
  """Each leaf of `a` as close to `exact` (the float32 computation) as `b` (another bfloat16
  path) is, within 2x and 1% of the leaf's scale: an elementwise bound missed on an H200 (4
  gradient entries of 4,096 apart by 0.67 where the leaf reached 11), not which was nearer."""
  for x, y, z in zip(*(jax.tree.leaves(t) for t in (a, b, exact)), strict=True):
    x, y, z = (np.asarray(t, np.float32) for t in (x, y, z))
    assert np.abs(x - z).max() <= 2 * np.abs(y - z).max() + 1e-2 * np.abs(z).max()


@pytest.mark.parametrize('kind,use_bias', [(kind, False) for kind in MASK_KINDS] +
                         [('none', True), ('combined', True), ('dense', True)])
def test_chunked_equals_reference_values_and_gradients(kind, use_bias):
  q_len = S if kind in ('causal', 'combined') else T  # causal: self-attention
  q, k, v = arrays(0, q_len)
  mask, dense = masks(kind, q_len, S)
  bias = (jnp.asarray(np.random.RandomState(1).randn(1, H, q_len, S), jnp.float32)
          if use_bias else None)
  cotangent = jnp.asarray(np.random.RandomState(2).randn(B, q_len, H, D + 2), jnp.float32)
  ref = value_and_grads(lambda q, k, v, b: attn.dot_product_attention(
      q, k, v, mask=dense, bias=b, scale=0.4), q, k, v, bias, cotangent)
  for block in ((16, 64) if use_bias else (16,)):  # several blocks (the last padded); one block
    out = value_and_grads(lambda q, k, v, b, block=block: attn.chunked_dot_product_attention(
        q, k, v, mask=mask, bias=b, scale=0.4, block_size=block), q, k, v, bias, cotangent)
    assert_close(out, ref, 2e-5)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(out))
  if kind == 'fully_masked_rows':
    np.testing.assert_array_equal(out[0][1], 0.0)
    np.testing.assert_array_equal(out[1][0][1], 0.0)  # and no gradient reaches them


def test_chunked_dropout_keeps_the_reference_elements():
  """The 'hash' dropout bits are a function of the weight's index: identical, not only alike."""
  q, k, v = arrays(3)
  mask, dense = masks('padding', T, S)
  cotangent = jnp.asarray(np.random.RandomState(4).randn(B, T, H, D + 2), jnp.float32)
  kwargs = dict(dropout_rate=0.3, dropout_rng=jax.random.key(5), deterministic=False)
  ref = value_and_grads(lambda q, k, v, b: attn.dot_product_attention(
      q, k, v, mask=dense, **kwargs), q, k, v, None, cotangent)
  out = value_and_grads(lambda q, k, v, b: attn.chunked_dot_product_attention(
      q, k, v, mask=mask, block_size=16, **kwargs), q, k, v, None, cotangent)
  assert_close(out, ref, 2e-5)
  no_dropout = attn.chunked_dot_product_attention(q, k, v, mask=mask, block_size=16)
  assert not np.allclose(out[0], no_dropout, atol=1e-3)
  with pytest.raises(ValueError, match='dropout_rng'):
    attn.chunked_dot_product_attention(q, k, v, dropout_rate=0.1, deterministic=False)


@pytest.mark.parametrize('shape,max_counter', [((2, 3, 5, 7), 2 ** 32), ((4, 3, 5, 7), 100)])
def test_hashed_bits_block_is_a_slice_of_hashed_bits(shape, max_counter):
  key = jax.random.key(0)
  full = attn.hashed_bits(key, shape, max_counter=max_counter)
  for start, size in ((0, 7), (2, 4), (5, 2)):
    np.testing.assert_array_equal(
        hashed_bits_block(key, shape, start, size, max_counter=max_counter),
        full[..., start:start + size])


def test_chunked_bfloat16_and_extra_batch_dims():
  q, k, v = (x.reshape(1, *x.shape) for x in arrays(6, dtype=jnp.bfloat16))
  ref = attn.dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                   v.astype(jnp.float32))
  out = attn.chunked_dot_product_attention(q, k, v, block_size=16)
  assert out.dtype == jnp.bfloat16 and out.shape == ref.shape
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=3e-2, rtol=3e-2)


def test_factored_mask_dense_is_the_combined_masks():
  q_valid = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]]) > 0
  seg = jnp.array([[1, 1, 2, 0], [1, 2, 0, 0]])
  mask = attn.FactoredMask(True, q_valid, q_valid, seg, seg)
  expected = attn.combine_masks(attn.causal_mask(4), attn.padding_mask(q_valid, q_valid),
                                attn.segment_mask(seg, seg))
  np.testing.assert_array_equal(mask.dense(4, 4), expected)
  np.testing.assert_array_equal(mask.dense(4, 2, key_start=1), expected[..., 1:3])
  assert attn.FactoredMask().dense(4, 4) is None


def temp_bytes(fn, length, heads=1, head_dim=32):
  x = jax.ShapeDtypeStruct((1, length, heads, head_dim), jnp.float32)
  grad = jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2))
  return jax.jit(grad).lower(x, x, x).compile().memory_analysis().temp_size_in_bytes


def test_chunked_memory_is_linear_in_length():
  """Forward + backward at length 8192: O(length x block) temporaries, against the
  reference's O(length^2) (its [length, length] float32 logits alone are 256 MiB)."""
  length, block = 8192, 512
  causal = attn.FactoredMask(causal=True)
  chunked = temp_bytes(lambda q, k, v: attn.chunked_dot_product_attention(
      q, k, v, mask=causal, block_size=block), length)
  reference = temp_bytes(lambda q, k, v: attn.dot_product_attention(
      q, k, v, mask=causal.dense(length, length)), length)
  logits_block = length * block * 4  # one [length, block] float32 block: 16 MiB
  assert chunked <= 8 * logits_block, chunked
  assert reference >= length * length * 4, reference
  assert reference >= 8 * chunked, (reference, chunked)


# ----------------------------------------------------------------------------- in the model

TINY = dict(kind='encoder_decoder', vocab_size=40, num_encoder_layers=1, num_decoder_layers=1,
            d_model=32, num_heads=4, d_ff=64, dropout_rate=0.1, attention_dropout_rate=0.1,
            max_len=32)


def model_outputs(config, src, tgt, params, deterministic, **packing):
  """(logits, gradients) of `config`'s model holding `params`."""
  config = ModelConfig.from_config(config)

  def logits(params):
    return bind(config, params)(src, tgt, deterministic=deterministic,
                                dropout_rng=jax.random.key(9), **packing)
  return jax.jit(lambda p: (logits(p), jax.grad(lambda p: logits(p).sum())(p)))(params)


def test_chunked_model_equals_reference_with_padding_packing_and_dropout():
  """Padded and packed rows, attention and residual dropout on: logits and gradients equal."""
  rng = np.random.RandomState(7)
  src = jnp.asarray(rng.randint(3, 40, (2, 10)), jnp.int32).at[1, 6:].set(0)
  tgt = jnp.asarray(rng.randint(3, 40, (2, 9)), jnp.int32).at[1, 5:].set(0)
  packing = dict(inputs_segmentation=jnp.array([[1] * 4 + [2] * 6, [1] * 3 + [2] * 3 + [0] * 4]),
                 targets_segmentation=jnp.array([[1] * 5 + [2] * 4, [1] * 2 + [2] * 3 + [0] * 4]))
  params = params_of(build_model(TINY))
  ref = model_outputs(TINY, src, tgt, params, False, **packing)
  out = model_outputs({**TINY, 'attention_impl': 'chunked'}, src, tgt, params, False,
                      **packing)
  assert_close(out, ref, 1e-4)


def test_build_time_refusals():
  base = dict(TINY, attention_dropout_rate=0.0, dtype='bfloat16', attention_impl='cudnn')
  ModelConfig.from_config(base).validate()
  for change, words in (({'dtype': 'float32'}, "dtype='bfloat16'"),
                        ({'attention_dropout_rate': 0.1}, 'attention dropout'),
                        ({'d_model': 36, 'num_heads': 3}, 'multiple of 8')):
    with pytest.raises(ConfigError, match='config.model.attention_impl') as error:
      build_model({**base, **change})
    assert words in str(error.value)
  with pytest.raises(ConfigError, match="dropout_rng_impl='hash'"):
    build_model({**TINY, 'attention_impl': 'chunked', 'dropout_rng_impl': 'threefry'})
  build_model({**TINY, 'attention_impl': 'chunked', 'dropout_rng_impl': 'threefry',
               'attention_dropout_rate': 0.0})


def test_cudnn_refuses_what_it_cannot_compute_exactly():
  """Refused before any kernel runs, on every backend: packed batches, dense masks, float32."""
  module = build_model(dict(TINY, attention_dropout_rate=0.0, dtype='bfloat16',
                            attention_impl='cudnn'))
  src = tgt = jnp.ones((1, 4), jnp.int32)
  seg = jnp.array([[1, 1, 2, 2]])
  with pytest.raises(ConfigError, match='packed'):
    jax.eval_shape(lambda: module(src, tgt, inputs_segmentation=seg, targets_segmentation=seg))
  q, k, v = arrays(8, dtype=jnp.bfloat16)
  with pytest.raises(ValueError, match='FactoredMask'):
    attn.cudnn_dot_product_attention(q, k, v, mask=jnp.ones((1, 1, T, S), bool))
  with pytest.raises(ValueError, match='float32'):
    attn.cudnn_dot_product_attention(*arrays(8))


# ----------------------------------------------------------------------------- GPU only

@needs_gpu
@pytest.mark.parametrize('kind', ['none', 'causal', 'padding', 'fully_masked_rows'])
def test_cudnn_equals_reference_values_and_gradients(kind):
  q_len = S if kind == 'causal' else T
  q, k, v = arrays(10, q_len, dtype=jnp.bfloat16)
  v = v[..., :D]  # cuDNN: value head size = query head size
  mask, dense = masks(kind, q_len, S)
  cotangent = jnp.asarray(np.random.RandomState(11).randn(B, q_len, H, D), jnp.float32)
  ref = value_and_grads(lambda q, k, v, b: attn.dot_product_attention(q, k, v, mask=dense),
                        q, k, v, None, cotangent)
  out = value_and_grads(lambda q, k, v, b: attn.cudnn_dot_product_attention(q, k, v, mask=mask),
                        q, k, v, None, cotangent)
  assert_close(out, ref, 5e-2)
  assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(out))


@needs_gpu
def test_cudnn_model_equals_reference():
  config = dict(TINY, attention_dropout_rate=0.0, dtype='bfloat16', d_model=64)
  rng = np.random.RandomState(12)
  src = jnp.asarray(rng.randint(3, 40, (2, 10)), jnp.int32).at[1, 6:].set(0)
  tgt = jnp.asarray(rng.randint(3, 40, (2, 8)), jnp.int32).at[1, 5:].set(0)
  params = params_of(build_model(config))
  for deterministic in (True, False):
    exact = model_outputs({**config, 'dtype': 'float32'}, src, tgt, params, deterministic)
    ref = model_outputs(config, src, tgt, params, deterministic)
    out = model_outputs({**config, 'attention_impl': 'cudnn'}, src, tgt, params,
                        deterministic)
    assert_no_less_exact(out, ref, exact)


@needs_gpu
def test_cudnn_marks_padding_that_is_not_at_the_end():
  q, k, v = arrays(13, dtype=jnp.bfloat16)
  k_valid = jnp.ones((B, S), bool).at[0, 3].set(False)  # a hole: not expressible as a length
  out = attn.cudnn_dot_product_attention(q, k, v[..., :D],
                                         mask=attn.FactoredMask(key_valid=k_valid))
  assert np.isnan(np.asarray(out[0], np.float32)).all()
  assert np.isfinite(np.asarray(out[1], np.float32)).all()
