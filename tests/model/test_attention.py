"""The pure attention functions against a plain NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import attention as attn


def numpy_attention(q, k, v, mask=None, bias=None, scale=None):
  """softmax(Q K^T * scale + bias) V in float64, masked rows -> 0."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  logits = np.einsum('...qhd,...khd->...hqk', q, k) * scale
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  if mask is not None:
    mask = np.broadcast_to(np.asarray(mask), logits.shape)
    logits = np.where(mask, logits, -np.inf)
  top = np.max(logits, axis=-1, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  e = np.exp(logits - top)
  denom = e.sum(-1, keepdims=True)
  weights = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
  return np.einsum('...hqk,...khd->...qhd', weights, v), weights


@pytest.mark.parametrize('shape', [(2, 5, 7, 3, 4), (1, 1, 1, 1, 8), (3, 4, 4, 2, 16)])
@pytest.mark.parametrize('use_mask', [False, True])
@pytest.mark.parametrize('use_bias', [False, True])
@pytest.mark.parametrize('scale', [None, 0.3])
def test_matches_numpy(shape, use_mask, use_bias, scale):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.RandomState(sum(shape))
  q = rng.randn(batch, q_len, heads, dim).astype(np.float32)
  k = rng.randn(batch, kv_len, heads, dim).astype(np.float32)
  v = rng.randn(batch, kv_len, heads, dim + 1).astype(np.float32)
  mask = rng.rand(batch, 1, q_len, kv_len) > 0.3 if use_mask else None
  bias = rng.randn(1, heads, q_len, kv_len).astype(np.float32) if use_bias else None
  expected_out, expected_w = numpy_attention(q, k, v, mask, bias, scale)
  out, w = attn.dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale,
                                      return_weights=True)
  np.testing.assert_allclose(out, expected_out, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(w, expected_w, atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(attn.dot_product_attention_weights(q, k, mask=mask, bias=bias,
                                                                scale=scale), expected_w,
                             atol=1e-6, rtol=1e-5)
  if not use_bias:  # the fused path is an option behind the same API (values as wide as keys)
    square = v[..., :dim]
    expected_square, _ = numpy_attention(q, k, square, mask, None, scale)
    np.testing.assert_allclose(attn.fused_dot_product_attention(q, k, square, mask=mask,
                                                                scale=scale),
                               expected_square, atol=1e-5, rtol=1e-5)


def test_fused_path_equals_reference():
  rng = np.random.RandomState(0)
  q, k, v = (rng.randn(2, 6, 4, 8).astype(np.float32) for _ in range(3))
  mask = attn.combine_masks(attn.causal_mask(6),
                            attn.padding_mask(jnp.array([[1] * 6, [1] * 3 + [0] * 3]) > 0,
                                              jnp.array([[1] * 6, [1] * 3 + [0] * 3]) > 0))
  np.testing.assert_allclose(attn.fused_dot_product_attention(q, k, v, mask=mask),
                             attn.dot_product_attention(q, k, v, mask=mask), atol=1e-5)


def test_fully_masked_rows_are_zero_not_nan():
  q = jnp.ones((1, 3, 2, 4))
  k = jnp.ones((1, 5, 2, 4))
  v = jnp.ones((1, 5, 2, 4))
  mask = jnp.zeros((1, 1, 3, 5), bool).at[:, :, 0, :2].set(True)

  @jax.jit  # one program (op by op, this test compiled each of ~100 ops: 8 s)
  def outputs(q):
    out, w = attn.dot_product_attention(q, k, v, mask=mask, return_weights=True)
    grad = jax.grad(lambda q: attn.dot_product_attention(q, k, v, mask=mask).sum())(q)
    return out, w, grad, attn.fused_dot_product_attention(q, k, v, mask=mask)
  out, w, grad, fused = (np.asarray(x) for x in outputs(q))
  assert not np.isnan(out).any()
  np.testing.assert_array_equal(out[0, 1:], 0.0)
  np.testing.assert_array_equal(w[0, :, 1:], 0.0)
  np.testing.assert_allclose(w[0, :, 0, :2].sum(-1), 1.0)
  assert np.isfinite(grad).all()  # gradients through fully masked rows are finite too
  np.testing.assert_allclose(fused, out, atol=1e-6)


def test_bfloat16_softmax_in_float32():
  rng = np.random.RandomState(1)
  q = jnp.asarray(rng.randn(2, 5, 2, 8) * 4, jnp.bfloat16)
  k = jnp.asarray(rng.randn(2, 9, 2, 8) * 4, jnp.bfloat16)
  v = jnp.asarray(rng.randn(2, 9, 2, 8), jnp.bfloat16)
  out, w = attn.dot_product_attention(q, k, v, return_weights=True)
  assert out.dtype == jnp.bfloat16 and w.dtype == jnp.bfloat16
  expected, _ = numpy_attention(np.asarray(q, np.float32), np.asarray(k, np.float32),
                                np.asarray(v, np.float32))
  np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=5e-2, rtol=5e-2)
  np.testing.assert_allclose(np.asarray(w, np.float32).sum(-1), 1.0, atol=2e-2)


def test_dropout_needs_rng_and_is_deterministic_with_one():
  q = k = v = jnp.ones((1, 4, 1, 2))
  with pytest.raises(ValueError, match='dropout_rng'):
    attn.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False)
  a = attn.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False,
                                 dropout_rng=jax.random.key(0))
  c = attn.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False,
                                 dropout_rng=jax.random.key(1))
  # Another key, other dropped weights. (The same key twice would run the same ops on the same
  # inputs: no check.)
  assert not np.array_equal(a, c)
  np.testing.assert_array_equal(attn.dot_product_attention(q, k, v, dropout_rate=0.5), 1.0)


def test_causal_mask():
  m = attn.causal_mask(4)
  assert m.shape == (1, 1, 4, 4) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(m[0, 0], np.tril(np.ones((4, 4), bool)))


def test_padding_mask():
  q_valid = jnp.array([[True, True, False]])
  k_valid = jnp.array([[True, False, True, False]])
  m = attn.padding_mask(q_valid, k_valid)
  assert m.shape == (1, 1, 3, 4)
  np.testing.assert_array_equal(m[0, 0], np.outer([1, 1, 0], [1, 0, 1, 0]).astype(bool))


def test_segment_mask_and_combine():
  seg = jnp.array([[1, 1, 2, 2, 0]])
  m = attn.segment_mask(seg, seg)
  assert m.shape == (1, 1, 5, 5)
  expected = np.equal.outer([1, 1, 2, 2, 0], [1, 1, 2, 2, 0])
  np.testing.assert_array_equal(m[0, 0], expected)
  assert attn.combine_masks(None, None) is None
  np.testing.assert_array_equal(attn.combine_masks(None, m), m)
  both = attn.combine_masks(m, attn.causal_mask(5))
  np.testing.assert_array_equal(both[0, 0], expected & np.tril(np.ones((5, 5), bool)))


def test_packed_segments_are_independent():
  """Changing one packed segment never changes another segment's outputs."""
  rng = np.random.RandomState(2)
  seg = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3]])
  mask = attn.combine_masks(attn.segment_mask(seg, seg), attn.causal_mask(8))
  q, k, v = (jnp.asarray(rng.randn(1, 8, 2, 4), jnp.float32) for _ in range(3))
  base = attn.dot_product_attention(q, k, v, mask=mask)
  k2 = k.at[:, 3:5].set(rng.randn(1, 2, 2, 4))
  v2 = v.at[:, 3:5].set(rng.randn(1, 2, 2, 4))
  changed = attn.dot_product_attention(q, k2, v2, mask=mask)
  np.testing.assert_array_equal(changed[:, :3], base[:, :3])
  np.testing.assert_array_equal(changed[:, 5:], base[:, 5:])
  assert not np.allclose(changed[:, 3:5], base[:, 3:5])


def test_split_merge_heads_roundtrip():
  x = jnp.arange(2 * 3 * 12, dtype=jnp.float32).reshape(2, 3, 12)
  h = attn.split_heads(x, 4)
  assert h.shape == (2, 3, 4, 3)
  np.testing.assert_array_equal(h[0, 0, 1], x[0, 0, 3:6])
  np.testing.assert_array_equal(attn.merge_heads(h), x)
  with pytest.raises(ValueError, match='divisible'):
    attn.split_heads(x, 5)


def test_sinusoidal_positions_formula():
  length, d = 50, 16
  pe = attn.sinusoidal_positions(length, d)
  assert pe.shape == (length, d) and pe.dtype == jnp.float32
  for p in (0, 1, 7, 49):
    for i in range(d // 2):
      angle = p / 10000 ** (2 * i / d)
      assert abs(pe[p, 2 * i] - np.sin(angle)) < 1e-6
      assert abs(pe[p, 2 * i + 1] - np.cos(angle)) < 1e-6


def test_rotary_depends_only_on_relative_position():
  rng = np.random.RandomState(3)
  q = jnp.asarray(rng.randn(1, 1, 1, 8), jnp.float32)
  k = jnp.asarray(rng.randn(1, 1, 1, 8), jnp.float32)

  def score(pq, pk):
    rq = attn.rotary_embedding(q, jnp.array([[pq]]))
    rk = attn.rotary_embedding(k, jnp.array([[pk]]))
    return float(jnp.sum(rq * rk))

  assert abs(score(3, 1) - score(10, 8)) < 1e-4
  assert abs(score(3, 1) - score(3, 2)) > 1e-4


@pytest.mark.parametrize('rng_impl', attn.DROPOUT_RNGS)
@pytest.mark.parametrize('rate', [0.1, 0.5])
def test_dropout_keeps_the_right_fraction_and_scales(rng_impl, rate):
  x = jnp.ones((512, 1024))
  y = attn.dropout(x, rate, jax.random.key(3), rng_impl=rng_impl)
  kept = np.asarray(y != 0)
  n = kept.size
  assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / (1 - rate), rtol=1e-6)
  # Another key, an independent mask (agreement p^2 + (1-p)^2). (The same key again would run
  # the same program on the same inputs: no check.)
  other = np.asarray(attn.dropout(x, rate, jax.random.key(4), rng_impl=rng_impl) != 0)
  agreement = (kept == other).mean()
  assert abs(agreement - (rate ** 2 + (1 - rate) ** 2)) < 0.005


def test_hashed_bits_look_uniform_and_independent():
  bits = np.asarray(attn.hashed_bits(jax.random.key(0), (256, 4096)))
  n = bits.size
  # Every bit position is a fair coin.
  for b in range(32):
    assert abs(((bits >> b) & 1).mean() - 0.5) < 5 * 0.5 / np.sqrt(n), b
  # Neighbours (in a row and across rows) are uncorrelated.
  u = bits.astype(np.float64) / 2 ** 32 - 0.5
  for a, b in [(u[:, 1:], u[:, :-1]), (u[1:], u[:-1])]:
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
  # Keys that differ in one fold_in give unrelated streams.
  base = jax.random.key(7)
  v = [np.asarray(attn.hashed_bits(jax.random.fold_in(base, i), (1 << 16,))) for i in range(2)]
  assert (v[0] == v[1]).mean() < 1e-3
  assert abs(np.corrcoef(v[0] / 2 ** 32, v[1] / 2 ** 32)[0, 1]) < 5 / np.sqrt(1 << 16)


def test_hashed_bits_of_tensors_too_large_for_one_counter():
  """Beyond 2^32 elements the leading index is hashed into the key: no repeated rows."""
  key = jax.random.key(0)
  split = np.asarray(attn.hashed_bits(key, (64, 1000), max_counter=1000))
  assert len({row.tobytes() for row in split}) == 64
  assert abs(((split >> 31) & 1).mean() - 0.5) < 5 * 0.5 / np.sqrt(split.size)
