"""The ablation options, each off by default: its equation against a NumPy
reference, its shapes, the model equal to the plain path at its off value, and what the
exports and --show_config say of it."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import optim
from configs import default
from hf_export import ctranslate2 as ct2_export, targets
from model import build, build_model, layers
from model.config import ModelConfig
from optim import ema as ema_lib, schedules
from tests.model.test_model import assert_cache_equals_full_forward
from training import steps
from training.state import TrainState

TINY = dict(kind='encoder_decoder', vocab_size=40, num_encoder_layers=1, num_decoder_layers=1,
            d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0, max_len=32)
OFF = {'norm': 'layer_norm', 'qk_norm': False, 'zero_init_out': False, 'activation': 'relu'}


def _tokens(seed, shape, low=3, high=40):
  return jnp.asarray(np.random.RandomState(seed).randint(low, high, shape), jnp.int32)


@functools.partial(jax.jit, static_argnums=1)
def _method(model, name, *args):
  return getattr(model, name)(*args)


def _params(module) -> dict:
  return nnx.state(module, nnx.Param).to_pure_dict()


def _flat(params) -> dict:
  return {jax.tree_util.keystr(p): np.asarray(v)
          for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


# ----------------------------------------------------------------------------- off = plain

def test_off_values_are_the_plain_model():
  plain, off = build_model(TINY), build_model({**TINY, **OFF})
  a, b = _flat(_params(plain)), _flat(_params(off))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  np.testing.assert_array_equal(_method(plain, '__call__', src, tgt),
                                _method(off, '__call__', src, tgt))


# ----------------------------------------------------------------------------- equations

def test_rms_norm_equation():
  x = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32)
  norm = layers.norm_layer('rms_norm', 8, nnx.Rngs(0), epsilon=1e-6)
  norm.scale[...] = jnp.arange(1.0, 9.0)
  expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * np.arange(
      1.0, 9.0)
  np.testing.assert_allclose(norm(jnp.asarray(x)), expected, rtol=1e-5)
  assert set(_flat(nnx.state(norm, nnx.Param).to_pure_dict())) == {"['scale']"}  # no bias
  model = build_model({**TINY, 'norm': 'rms_norm'})
  names = _flat(_params(model))
  assert not any('norm' in k and 'bias' in k for k in names)
  assert "['encoder']['layers'][0]['ffn_norm']['scale']" in names


def _dense_ref(x, dense):
  kernel = np.asarray(dense.kernel[...], np.float64)
  flat = kernel.reshape(x.shape[-1], -1)
  return (x @ flat).reshape(*x.shape[:-1], *kernel.shape[1:]) + np.asarray(dense.bias[...])


@pytest.mark.parametrize('activation', ['relu2', 'swiglu'])
def test_feed_forward_equations(activation):
  ffn = layers.FeedForward(8, 12, activation=activation, rngs=nnx.Rngs(0))
  ffn.wi.bias[...] = jax.random.normal(jax.random.key(1), ffn.wi.bias.shape)
  x = np.random.RandomState(2).randn(3, 8)
  h = _dense_ref(x, ffn.wi)
  if activation == 'relu2':
    assert ffn.wi.kernel.shape == (8, 12)
    inner = np.maximum(h, 0) ** 2
  else:  # (silu(x W + b) * (x V + c)): one [d_model, 2, d_ff] kernel, gate first
    assert ffn.wi.kernel.shape == (8, 2, 12) and ffn.wo.kernel.shape == (12, 8)
    gate, up = h[:, 0], h[:, 1]
    inner = gate / (1 + np.exp(-gate)) * up
  expected = inner @ np.asarray(ffn.wo.kernel[...], np.float64) + np.asarray(ffn.wo.bias[...])
  np.testing.assert_allclose(ffn(jnp.asarray(x, jnp.float32)), expected, rtol=2e-5, atol=2e-6)


def test_swiglu_at_two_thirds_d_ff_keeps_the_parameters():
  def count(**fields):
    return sum(v.size for v in _flat(_params(build_model({**TINY, **fields}))).values())
  plain, gated = count(d_ff=96), count(d_ff=64, activation='swiglu')
  assert abs(gated - plain) / plain < 0.01  # only the extra bias of the gate


def test_qk_norm_attention_equation():
  attention = layers.MultiHeadAttention(16, 2, qk_norm=True, rngs=nnx.Rngs(0))
  attention.query_norm.scale[...] = jnp.linspace(0.5, 2.0, 8)
  x = np.random.RandomState(3).randn(1, 5, 16)
  out, _ = attention(jnp.asarray(x, jnp.float32))
  qkv = _dense_ref(x, attention.qkv)  # [1, 5, 3, heads, head_dim]
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

  def rms(y, scale):
    return y / np.sqrt((y ** 2).mean(-1, keepdims=True) + layers.LAYER_NORM_EPS) * scale
  q = rms(q, np.asarray(attention.query_norm.scale[...]))
  k = rms(k, np.asarray(attention.key_norm.scale[...]))
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(8)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum('bhqk,bkhd->bqhd', weights, v)
  out_kernel = np.asarray(attention.out.kernel[...], np.float64).reshape(16, 16)
  expected = heads.reshape(1, 5, 16) @ out_kernel + np.asarray(attention.out.bias[...])
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('fields', [{'qk_norm': True}, {'activation': 'swiglu', 'norm': 'rms_norm',
                                                        'norm_position': 'pre'}])
def test_kv_cache_matches_full_forward(fields):
  assert_cache_equals_full_forward(build_model({**TINY, **fields}))


@pytest.mark.parametrize('init', ['paper', 'gpt2'])
def test_zero_init_out(init):
  plain = _flat(_params(build_model({**TINY, 'init': init})))
  zeroed = _flat(_params(build_model({**TINY, 'init': init, 'zero_init_out': True})))
  for name, value in zeroed.items():
    if name.endswith("['out']['kernel']") or name.endswith("['wo']['kernel']"):
      assert not value.any() and plain[name].any(), name
    else:  # every other parameter is drawn as before, from the same keys
      np.testing.assert_array_equal(value, plain[name], err_msg=name)


# ----------------------------------------------------------------------------- training

def test_wsd_schedule():
  schedule = schedules.wsd_schedule(2.0, warmup_steps=10, num_steps=100, decay_fraction=0.2,
                                min_ratio=0.1)
  def reference(step):  # the update count from 0, as every schedule here
    if step < 10:
      return 2.0 * (step + 1) / 10
    if step < 80:
      return 2.0
    return 2.0 + (0.2 - 2.0) * min(step - 79, 20) / 20  # the decay's k-th update: k/20 of it
  for step in (0, 4, 9, 10, 50, 79, 80, 85, 98, 99, 100, 150):
    assert float(schedule(step)) == pytest.approx(reference(step), rel=1e-6), step


@pytest.mark.parametrize('num_steps, decay_fraction', [(100, 0.2), (10, 0.1), (7, 0.01), (1, 1.0)])
def test_wsd_schedule_last_update_is_the_floor(num_steps, decay_fraction):
  """The run's last update (count num_steps - 1) takes min_ratio x the peak, and a decay of
  one update decays (it was one update short: the floor came at count num_steps, never run)."""
  schedule = schedules.wsd_schedule(2.0, warmup_steps=0, num_steps=num_steps,
                                decay_fraction=decay_fraction, min_ratio=0.1)
  assert float(schedule(num_steps - 1)) == pytest.approx(0.2, rel=1e-6)
  if num_steps > 1:  # the update before the decay is at the peak
    decay_steps = max(1, round(decay_fraction * num_steps))
    assert float(schedule(num_steps - 1 - decay_steps)) == pytest.approx(2.0, rel=1e-6)


def _state_and_batch(config, tx, seed=0):
  module = build_model(config)
  params = _params(module)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.key(seed))
  batch = {'inputs': _tokens(5, (2, 6)), 'targets': _tokens(6, (2, 5)).at[1, 3:].set(0)}
  return state, batch


def test_z_loss_gradient():
  config = ModelConfig.from_config(TINY)
  tx = optax.sgd(1.0)
  state, batch = _state_and_batch(config, tx)
  # z_loss=0 is the plain step by construction (a Python branch: the same program).
  plain = steps.make_train_step(config, tx, lambda s: 1.0, label_smoothing=0.1, z_loss=0.0)
  on = steps.make_train_step(config, tx, lambda s: 1.0, label_smoothing=0.1, z_loss=0.5)
  _, ma = jax.jit(plain)(state, batch)
  c, mc = jax.jit(on)(state, batch)
  assert float(mc['loss']) == float(ma['loss'])  # the reported loss is the cross-entropy
  # The update is minus the gradient of mean(loss + 0.5 * logsumexp(logits)^2).
  weights = steps.target_weights(batch)

  def objective(params):
    logits = steps.apply_model(config, params, batch, deterministic=True)
    from training.losses import cross_entropy_and_accuracy  # pylint: disable=import-outside-toplevel
    loss, _ = cross_entropy_and_accuracy(logits, batch['targets'], 0.1)
    z = jax.nn.logsumexp(logits, axis=-1) ** 2
    return ((loss + 0.5 * z) * weights).sum() / weights.sum()
  grads = jax.jit(jax.grad(objective))(state.params)
  expected = jax.tree.map(lambda p, g: p - g, state.params, grads)
  for x, y in zip(jax.tree.leaves(c.params), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(x, y, atol=2e-5)


def test_muon_reads_a_new_layer_from_its_logical_axes():
  """A layer optim/ has never seen is Muon's by the names of its axes alone: 'embed' first
  (fan_in) or last (fan_out) beside another named axis; no 'vocab'; unnamed axes and 'layers'
  are batch axes."""
  P = jax.sharding.PartitionSpec
  axes = {'router': {'kernel': P('embed', None, 'mlp')}, 'down': {'kernel': P('layers', 'mlp',
          'embed')}, 'table': P('vocab', 'embed'), 'pos': P(None, 'embed'), 'bias': P('embed'),
          'mixer': {'kernel': P('heads', 'embed', 'kv')}}
  dims = optim.muon_dimensions(axes)
  assert (dims['router']['kernel'].reduction_axis, dims['router']['kernel'].output_axis) == (
      (0,), (2,))
  assert (dims['down']['kernel'].reduction_axis, dims['down']['kernel'].output_axis) == (
      (1,), (2,))
  assert dims['table'] is None and dims['pos'] is None and dims['bias'] is None
  assert dims['mixer']['kernel'] is None  # 'embed' inside: not a map from or to the stream


def test_muon_takes_the_layers_matrices_and_adam_the_rest(tmp_path):
  config = default.get_config('tiny')
  config.optimizer.name = 'muon'
  config.optimizer.schedule = 'wsd'
  axes = build.logical_axes(ModelConfig.from_config({**TINY, 'activation': 'swiglu'}))
  is_spec = lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)  # noqa: E731
  dims = _flat(jax.tree.map(lambda d: np.asarray(d is not None), optim.muon_dimensions(axes),
                            is_leaf=is_spec))
  muon = sorted(k for k, v in dims.items() if v)
  # The encoder layer's qkv, out, wi, wo; the decoder layer's those and the cross query, kv, out.
  assert all(k.endswith("['kernel']") for k in muon) and len(muon) == 4 + 7
  assert not dims["['embed']['embedding']"]
  spec = optim.muon_dimensions(axes)['encoder']['layers'][0]['self_attention']['qkv']['kernel']
  assert (spec.reduction_axis, spec.output_axis) == ((0,), (2, 3))  # Q, K, V apart
  tx = optim.make_optimizer(config)
  model_config = ModelConfig.from_config({**TINY, 'activation': 'swiglu'})
  _, batch = _state_and_batch(model_config, tx)
  # Laid out on a mesh and checkpointed as train.py does: Muon's partitioned state (each part
  # a parameter tree with MaskedNodes for the other's) failed there, though a step ran.
  from training import mesh  # pylint: disable=import-outside-toplevel
  from training.state import abstract_train_state, create_train_state  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  state = create_train_state(model_config, tx, 0, mesh.make_mesh(1))
  step = jax.jit(steps.make_train_step(model_config, tx, optim.make_schedule(config),
                                       label_smoothing=0.1))
  new, metrics = step(state, batch)
  assert bool(metrics['finite'])
  saver = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  saver.save(1, new, None)
  restored, _, at = saver.restore(abstract_train_state(model_config, tx, mesh.make_mesh(1)),
                                  allow_fresh_data=True)
  saver.close()
  assert at == 1
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(new), strict=True):
    np.testing.assert_array_equal(a, b)
  # An orthogonalised update: the FFN's output kernel moves by a matrix whose leading singular
  # values are about equal (Newton-Schulz's 5 steps: within ~[0.7, 1.2] of each other; the
  # gradient has rank <= the batch's 12 tokens, so only the leading ones are set).
  before = state.params['encoder']['layers'][0]['ffn']['wo']['kernel']
  after = new.params['encoder']['layers'][0]['ffn']['wo']['kernel']
  singular = np.linalg.svd(np.asarray(after - before, np.float64), compute_uv=False)
  assert singular[0] / singular[4] < 1.8, singular[:6]


# ----------------------------------------------------------------------------- the outside

@pytest.mark.parametrize('fields, feature', [
    ({'norm': 'rms_norm'}, 'norm=rms_norm'), ({'qk_norm': True}, 'qk_norm=True'),
    ({'activation': 'relu2'}, 'activation=relu2'), ({'activation': 'swiglu'}, 'activation=swiglu'),
])
def test_exports_refuse_what_they_cannot_compute(fields, feature):
  config = ModelConfig.from_config({**TINY, **fields})
  for check in (targets.check_exportable, ct2_export.check):
    with pytest.raises(targets.UnsupportedConfig) as e:
      check(config)
    assert f'config.model.{feature} cannot be exported' in str(e.value)
    assert '\n' not in str(e.value)
  zero = ModelConfig.from_config({**TINY, 'zero_init_out': True})
  targets.check_exportable(zero)  # an initialisation: the trained model exports as any
  ct2_export.check(zero)


def test_show_config_lists_each_option_with_its_doc():
  from configs import resolve, show  # pylint: disable=import-outside-toplevel
  table = show.table(*resolve.resolve('configs/default.py'), 'configs/default.py')
  for field in ('model.norm', 'model.qk_norm', 'model.zero_init_out', 'model.activation',
                'optimizer.name', 'optimizer.schedule', 'optimizer.decay_fraction',
                'train.z_loss'):
    (line,) = [line for line in table.splitlines() if line.split()[:1] == [field]]
    assert len(line.split()) > 4, line  # value, origin and a doc
  assert 'rms_norm' in table and 'swiglu' in table and 'muon' in table and 'wsd' in table


# ----------------------------------------------------------------------------- EMA

def test_ema_equation_and_off_is_the_plain_optimizer():
  tx = ema_lib.with_ema(optax.sgd(0.5), 0.9)
  params = {'w': jnp.array([1.0, -2.0])}
  state = tx.init(params)
  ema, p = np.array([1.0, -2.0]), np.array([1.0, -2.0])
  for n in range(1, 6):
    grads = {'w': jnp.array([0.3 * n, 0.1])}
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    p = p - 0.5 * np.array([0.3 * n, 0.1])
    d = min(0.9, (1 + n) / (10 + n))
    ema = d * ema + (1 - d) * p
    np.testing.assert_allclose(state.ema['w'], ema, rtol=1e-6)
    np.testing.assert_allclose(params['w'], p, rtol=1e-6)
  np.testing.assert_allclose(ema_lib.weights(TrainState(0, params, state, None))['w'], ema,
                             rtol=1e-6)
  config = default.get_config('tiny')
  assert not isinstance(optim.make_optimizer(config).init(params), ema_lib.EmaState)
  config.train.ema_decay = 0.99
  assert isinstance(optim.make_optimizer(config).init(params), ema_lib.EmaState)


def test_ema_is_checkpointed_evaluated_and_decoded(tmp_path):
  """A run with train.ema_decay keeps the average in its checkpoints; decoding (and
  `init_from`) restores the average, not the last parameters; a resume may not turn it off.
  (On the synthetic data, as the trainer's other tests: the bundled corpus and its tokenizer,
  which this run trained first, are test_train_cli's end-to-end run's.)"""
  import inference  # pylint: disable=import-outside-toplevel
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  from tests.training import test_train_synthetic as syn  # pylint: disable=import-outside-toplevel
  from training import config_check  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint, config_io  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / 'ema')
  overrides = {'train.checkpoint_every_steps': 6, 'train.eval_every_steps': 6,
               'train.ema_decay': 0.5, 'data.tokenizer': 'char'}  # decoding's, saved below
  final = syn.run(workdir, 'encoder_decoder', overrides)['state']
  tokenizers.CharTokenizer(list(syn.ALPHABET)).save(os.path.join(workdir, 'tokenizer'))
  assert isinstance(final.opt_state, ema_lib.EmaState)
  stored_ema, step = checkpoint.restore_params(workdir, config=config_io.load_config(workdir))
  last, _ = checkpoint.restore_params(workdir)
  assert step == 6
  for a, b in zip(jax.tree.leaves(stored_ema), jax.tree.leaves(final.opt_state.ema),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, c) for a, c in zip(jax.tree.leaves(stored_ema),
                                                     jax.tree.leaves(last), strict=True))
  restored = inference.Restored(workdir)
  np.testing.assert_array_equal(restored.params['embed']['embedding'],
                                stored_ema['embed']['embedding'])
  config = syn.tiny_config('encoder_decoder', **{**overrides, 'train.ema_decay': 0.0})
  with pytest.raises(config_check.IncompatibleWorkdirError, match='train.ema_decay=0.5'):
    config_check.check_compatible(config, workdir)
