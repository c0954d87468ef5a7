"""The NNX model against its oracle, the Linen model of 0.1 (issue 43 item 2): the same
parameters (`model.params_v01.from_linen`) give the same logits for every kind and option,
the same 50 training steps, and the NNX model's cached decoding equals its full pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from model import kinds, nnx_transformer as nt, params_v01
from model.config import ModelConfig
from model.stacks import unrolled

TINY = dict(kind='encoder_decoder', vocab_size=16, num_encoder_layers=2, num_decoder_layers=2,
            d_model=8, num_heads=2, d_ff=16, max_len=32, dropout_rate=0.0)
NNX_CLASSES = {'encoder_decoder': nt.EncoderDecoder, 'decoder_only': nt.DecoderOnly,
               'encoder_only': nt.EncoderOnly}
OPTIONS = {
    'paper': {},
    'decoder_only': dict(kind='decoder_only', num_encoder_layers=0),
    'encoder_only': dict(kind='encoder_only', num_decoder_layers=0),
    'pre_ln_gelu': dict(norm_position='pre', activation='gelu'),
    'learned_untied': dict(positional_encoding='learned', share_embeddings=False,
                           logits_via_embedding=False, init='gpt2', scale_embeddings=False),
    'rope': dict(positional_encoding='rope'),
    'scan_remat': dict(scan_layers=True, remat=True, norm_position='pre'),
    'bfloat16_f32_stream': dict(dtype='bfloat16', residual_dtype='float32'),
    'chunked': dict(attention_impl='chunked'),
    'xla_general': dict(attention_impl='xla', projection_matmul='general'),
    'lm_scan_learned': dict(kind='decoder_only', num_encoder_layers=0, scan_layers=True,
                            positional_encoding='learned'),
}


def _batch(kind: str, seed: int = 0):
  """Right-padded source and target rows of different lengths `[3, 7]`, `[3, 6]`."""
  rng = np.random.RandomState(seed)
  src = rng.randint(1, 16, (3, 7)) * (np.arange(7) < np.array([[7], [5], [3]]))
  tgt = rng.randint(1, 16, (3, 6)) * (np.arange(6) < np.array([[6], [4], [2]]))
  src, tgt = jnp.asarray(src, jnp.int32), jnp.asarray(tgt, jnp.int32)
  return (src, tgt) if kinds.ADAPTERS[kind].has_source else (tgt,)


def oracle_pair(**changes):
  """(config, Linen module, its params, the NNX model holding the same params)."""
  config = ModelConfig(**{**TINY, **changes})
  adapter = kinds.adapter_of(config)
  linen = adapter.module_class(config)
  params = linen.init(jax.random.key(1), *adapter.example_inputs(),
                      deterministic=True)['params']
  model = NNX_CLASSES[config.kind](config, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params_v01.from_linen(params))
  nnx.update(model, state)
  return config, linen, params, model


@pytest.mark.parametrize('name', OPTIONS)
def test_logits_equal_the_linen_oracle(name):
  config, linen, params, model = oracle_pair(**OPTIONS[name])
  args = _batch(config.kind)
  expected = linen.apply({'params': params}, *args)
  got = jax.jit(lambda m, *a: m(*a))(model, *args)
  tol = 1e-2 if config.dtype == 'bfloat16' else 1e-6
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32),
                             atol=tol, rtol=tol)


def test_every_parameter_is_converted_and_named():
  """The conversion covers every NNX parameter (no initial value survives) and every
  parameter names its logical axes, with 'layers' first in a scanned stack."""
  for changes in OPTIONS.values():
    _, _, params, model = oracle_pair(**changes)
    converted = params_v01.from_linen(params)
    assert len(jax.tree.leaves(converted)) == len(jax.tree.leaves(nnx.state(model, nnx.Param)))
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
      axes = variable.get_metadata().get('axes')
      norm = any('norm' in str(p) for p in path)
      assert norm or len(axes) == variable[...].ndim, (path, axes)
      if changes.get('scan_layers') and 'layers' in path:
        assert norm or axes[0] == 'layers', (path, axes)


def _loss_fn(apply, kind):
  def loss(params, batch):
    logits = apply(params, *batch)
    targets = batch[-1]
    weights = (targets > 0).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(ce * weights) / jnp.sum(weights)
  return loss


@pytest.mark.parametrize('name', ['paper', 'lm_scan_learned'])
def test_fifty_training_steps_equal_the_linen_oracle(name):
  """50 Adam steps from the same parameters on the same batches: the same losses, to float32
  rounding (the programs differ: XLA may order the sums differently)."""
  config, linen, params, model = oracle_pair(**OPTIONS[name])
  graphdef, nnx_params = nnx.split(model, nnx.Param)
  tx = optax.adam(1e-2)

  def run(apply, params):
    loss_fn = _loss_fn(apply, config.kind)

    @jax.jit
    def step(params, opt_state, batch):
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss
    opt_state, losses = tx.init(params), []
    for i in range(50):
      params, opt_state, loss = step(params, opt_state, _batch(config.kind, seed=i % 5))
      losses.append(float(loss))
    return np.array(losses)

  expected = run(lambda p, *a: linen.apply({'params': p}, *a), params)
  got = run(lambda p, *a: nnx.merge(graphdef, p)(*a), nnx_params)
  assert expected[-1] < expected[0] * 0.7  # it learns: the comparison means something
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', ['paper', 'rope', 'lm_scan_learned'])
def test_cached_decoding_equals_the_full_pass(name):
  """Feeding the targets one token at a time through `step` on the KV cache gives the full
  (teacher-forced) pass's logits at every position."""
  config, _, _, model = oracle_pair(**OPTIONS[name])
  model = unrolled(model)
  *source, targets = _batch(config.kind)
  full = model(*source, targets)
  inputs = source[0] if source else None
  encoded = model.encode(inputs) if source else None
  cache = model.init_cache(targets.shape[0], targets.shape[1], encoded, inputs)
  decoder_inputs = nt.shift_right(targets)
  steps = []
  for t in range(targets.shape[1]):
    logits, cache = model.step(cache, inputs, decoder_inputs[:, t:t + 1])
    steps.append(logits)
  valid = np.asarray(targets > 0)[..., None]
  np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)) * valid,
                             np.asarray(full) * valid, atol=1e-5, rtol=1e-5)


def test_scanned_layers_equal_unrolled_with_dropout():
  """A layer's dropout key depends on its index only, so the scanned stack and the unrolled
  one draw the same masks: same logits with dropout on."""
  config, _, _, model = oracle_pair(scan_layers=True, dropout_rate=0.3,
                                    attention_dropout_rate=0.2)
  args = _batch(config.kind)
  key = jax.random.key(7)
  scanned = model(*args, deterministic=False, dropout_rng=key)
  unrolled_out = unrolled(model)(*args, deterministic=False, dropout_rng=key)
  np.testing.assert_allclose(np.asarray(unrolled_out), np.asarray(scanned), atol=1e-6)
  assert not np.allclose(np.asarray(scanned), np.asarray(model(*args)), atol=1e-3)
