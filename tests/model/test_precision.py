"""Reduced-precision behaviour, with tolerances derived from the number formats.

The rest of the suite runs float32 matmuls at full precision (tests/conftest.py), so that its
equality tests hold on every backend. Here each precision is asked for explicitly, and the
error allowed is what the format's rounding can cause: a matmul with inputs rounded to unit
roundoff `u` (and float32 accumulation over `k` terms) is off by at most
`(2u + k * u32) * sum_k |a_ik| |b_kj|` per entry.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import accelerator
from model import build_model, layers, transformer
from model.build import with_options

U32 = 2.0 ** -24  # unit roundoff of float32 (24-bit significand)
U_TF32 = 2.0 ** -11  # TF32: 11-bit significand (10 stored)
U_BF16 = 2.0 ** -8  # bfloat16: 8-bit significand (7 stored)


def input_roundoff(backend: str, precision: str) -> float:
  """Unit roundoff of a float32 matmul's inputs at `precision` on `backend`."""
  if backend == 'cpu' or precision == 'highest':
    return U32
  if precision == 'high':  # bf16_3x on TPU, TF32 or bf16_3x on GPU: at worst TF32
    return U_TF32
  return U_TF32 if backend == 'gpu' else U_BF16  # 'default': TF32 (GPU), one bf16 pass (TPU)


def test_suite_drops_the_xla_flags_this_xla_does_not_know():
  """jax 0.11.2's XLA aborted every xdist worker on a CPU flag 0.10.2 has: the suite keeps
  only the flags the installed XLA accepts, and the deterministic-ops flag is one of them."""
  from tests import conftest  # pylint: disable=import-outside-toplevel
  kept = conftest._flags_this_xla_knows(['--xla_cpu_no_such_flag=1',
                                         conftest.DETERMINISTIC_XLA_FLAG])
  assert kept == [conftest.DETERMINISTIC_XLA_FLAG]


@pytest.mark.parametrize('precision', accelerator.MATMUL_PRECISIONS)
def test_float32_matmul_error_within_input_rounding(precision):
  rng = np.random.RandomState(0)
  k = 256
  a, b = rng.randn(64, k).astype(np.float32), rng.randn(k, 48).astype(np.float32)
  with accelerator.matmul_precision(precision):
    if precision == 'default':  # the backend's own default, not the suite's 'highest'
      with jax.default_matmul_precision(None):
        out = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
    else:
      out = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  magnitude = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
  u = input_roundoff(jax.default_backend(), precision)
  bound = (2 * u + k * U32) * magnitude
  assert np.all(np.abs(out - exact) <= bound)


# A model's forward pass as one program (op by op, each op compiled: 5-16 s a model).
_forward = jax.jit(lambda module, *tokens: module(*tokens))


def test_bfloat16_compute_error_scales_with_bfloat16_roundoff():
  """bf16 activations and matmul inputs (float32 params, softmax and LayerNorm statistics):
  the logits' relative error is within bf16's roundoff per sublayer (measured 0.79% against a
  bound of 7.8%) and far above float32's. A wrong cast of the statistics does not show in
  that error at this size (the softmax in bf16 measured 0.82%), so the statistics' dtypes
  are read from the traced program instead: every exp (softmax) and rsqrt (LayerNorm) is
  float32."""
  config = dict(kind='encoder_decoder', vocab_size=64, num_encoder_layers=2,
                num_decoder_layers=2, d_model=64, num_heads=4, d_ff=128, max_len=32)
  rng = np.random.RandomState(1)
  src = jnp.asarray(rng.randint(3, 64, (4, 12)), jnp.int32)
  tgt = jnp.asarray(rng.randint(3, 64, (4, 10)), jnp.int32)
  reference = build_model(config)
  exact = np.asarray(_forward(reference, src, tgt), np.float64)
  low = np.asarray(_forward(with_options(reference, dtype='bfloat16'), src, tgt), np.float64)
  relative = np.linalg.norm(low - exact) / np.linalg.norm(exact)
  sublayers = 2 * 2 + 2 * 3  # encoder: attention + FFN; decoder: + cross-attention
  assert relative <= 2 * U_BF16 * sublayers
  assert relative > U32 * 100  # it really computed in bf16
  bf16 = with_options(reference, dtype='bfloat16')
  jaxpr = jax.make_jaxpr(lambda s, t: bf16(s, t))(src, tgt).jaxpr
  statistics = [str(v.aval.dtype) for eqn in _equations(jaxpr)
                if eqn.primitive.name in ('exp', 'rsqrt') for v in eqn.outvars]
  assert statistics and set(statistics) == {'float32'}, statistics


def _equations(jaxpr):
  """Every equation of `jaxpr` and of the programs nested in it (jit, custom_vjp, scan)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (list, tuple)) else [value]):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          yield from _equations(inner)


def _stream_config(**changes):
  config = dict(kind='encoder_decoder', vocab_size=64, num_encoder_layers=2,
                num_decoder_layers=2, d_model=64, num_heads=4, d_ff=128, max_len=32,
                dtype='bfloat16', residual_dtype='float32', dropout_rate=0.1,
                attention_dropout_rate=0.1)
  return {**config, **changes}


def _pair(seed):
  """A random (source, target) batch for the 64-token models below."""
  rng = np.random.RandomState(seed)
  return (jnp.asarray(rng.randint(3, 64, (2, 9)), jnp.int32),
          jnp.asarray(rng.randint(3, 64, (2, 7)), jnp.int32))


def _run_recording(model, src, tgt, monkeypatch):
  """-> (training-mode logits, {what: [output dtypes]}) for every residual `x + Sublayer(x)`,
  every dense projection, the token embeddings and the encoder's output."""
  seen = {'residual': [], 'dense': [], 'embed': [], 'encoder': []}

  def record(name, fn):
    def wrapped(*args, **kwargs):
      out = fn(*args, **kwargs)
      seen[name].append(out.dtype)
      return out
    return wrapped
  monkeypatch.setattr(transformer, 'residual', record('residual', transformer.residual))
  for name, cls in (('dense', layers.Dense), ('embed', layers.Embed),
                    ('encoder', transformer.Encoder)):
    monkeypatch.setattr(cls, '__call__', record(name, cls.__call__))
  # Traced, not run: the dtypes are the program's (op by op, each model took 5-16 s).
  logits = jax.eval_shape(lambda: model(src, tgt, deterministic=False,
                                        dropout_rng=jax.random.key(1)))
  return logits, seen


@pytest.mark.parametrize('norm_position', ['pre', 'post'])
@pytest.mark.parametrize('residual_dtype,stream', [('float32', jnp.float32),
                                                   ('compute', jnp.bfloat16)])
def test_residual_dtype_sets_the_stream_and_leaves_the_matmuls_in_bfloat16(
    norm_position, residual_dtype, stream, monkeypatch):
  config = _stream_config(norm_position=norm_position, residual_dtype=residual_dtype)
  src, tgt = _pair(2)
  logits, dtypes = _run_recording(build_model(config), src, tgt, monkeypatch)
  assert len(dtypes['residual']) == 2 * 2 + 2 * 3  # every x + Sublayer(x)
  assert set(dtypes['residual']) == {jnp.dtype(stream)}
  assert set(dtypes['embed']) == {jnp.dtype(stream)}  # the token embeddings enter the stream
  # Q/K/V (fused, or query + kv) and W^O per attention, W_1 and W_2 per feed-forward
  assert len(dtypes['dense']) == 2 * (2 + 2) + 2 * (2 + 3 + 2)
  assert set(dtypes['dense']) == {jnp.dtype(jnp.bfloat16)}
  assert dtypes['encoder'] == [jnp.bfloat16] and logits.dtype == jnp.float32


def test_float32_residual_is_the_plain_path_in_float32():
  config = _stream_config(dtype='float32', residual_dtype='compute', norm_position='pre')
  src, tgt = _pair(3)
  model = build_model(config)
  plain = _forward(model, src, tgt)
  kept = _forward(with_options(model, residual_dtype='float32'), src, tgt)
  np.testing.assert_array_equal(np.asarray(plain), np.asarray(kept))


def test_float32_residual_keeps_small_updates_that_a_bfloat16_stream_rounds_away():
  """Unit-size token embeddings (the paper's scale) and GPT-2's small residual projections:
  each sub-layer adds ~1e-2 to a stream of size ~1, where bfloat16's spacing is ~8e-3, so a
  bfloat16 stream loses much of every update; a float32 one keeps them."""
  config = dict(kind='decoder_only', vocab_size=64, num_encoder_layers=0,
                num_decoder_layers=6, d_model=64, num_heads=4, d_ff=256, max_len=32,
                positional_encoding='learned', norm_position='pre', init='gpt2',
                logits_via_embedding=False)
  tokens = jnp.asarray(np.random.RandomState(4).randint(3, 64, (4, 16)), jnp.int32)
  reference = build_model(config)
  exact = np.asarray(_forward(reference, tokens), np.float64)

  def error(residual_dtype):
    model = with_options(reference, dtype='bfloat16', residual_dtype=residual_dtype)
    low = np.asarray(_forward(model, tokens), np.float64)
    return np.linalg.norm(low - exact) / np.linalg.norm(exact)

  assert error('float32') < error('compute') / 2


def test_bad_residual_dtype_names_the_field():
  with pytest.raises(ValueError, match=r'config\.model\.residual_dtype=.float16. is not one of'):
    build_model(_stream_config(residual_dtype='float16'))
