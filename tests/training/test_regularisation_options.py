"""The regularisers of research round 2, each off by default: activation dropout
(`model.activation_dropout_rate`) and R-Drop (`train.rdrop_alpha`). Their equations against
NumPy, the off value as the plain program, an exact resume, and what the exports say."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import default, schema
from hf_export import convert, ctranslate2 as ct2_export, targets
from hf_import import architectures
from model import build_model, layers
from model.config import ConfigError, ModelConfig
from model.dropout import hashed_bits, keep_threshold
from tests.model.test_model import assert_cache_equals_full_forward, call
from tests.training import test_train_synthetic as syn
from training import steps
from training.losses import smoothed_cross_entropy, symmetric_kl, symmetric_kl_reference
from training.state import TrainState

# The trainer's runs (the resume test) share their compiled programs.
compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)

TINY = dict(kind='encoder_decoder', vocab_size=40, num_encoder_layers=1, num_decoder_layers=1,
            d_model=32, num_heads=4, d_ff=64, dropout_rate=0.1, max_len=32)
KINDS = {'encoder_decoder': {}, 'decoder_only': {'kind': 'decoder_only', 'num_encoder_layers': 0},
         'encoder_only': {'kind': 'encoder_only', 'num_decoder_layers': 0}}


def _tokens(seed, shape, low=3, high=40):
  return jnp.asarray(np.random.RandomState(seed).randint(low, high, shape), jnp.int32)


def _params(module) -> dict:
  return nnx.state(module, nnx.Param).to_pure_dict()


def _batch(kind: str) -> dict:
  batch = {'targets': _tokens(6, (2, 5)).at[1, 3:].set(0)}  # row 1: two pad targets
  if kind == 'encoder_decoder':
    batch['inputs'] = _tokens(5, (2, 6))
  return batch


def _state(config, tx, seed=0) -> TrainState:
  params = _params(build_model(config))
  return TrainState(step=jnp.asarray(3, jnp.int32), params=params, opt_state=tx.init(params),
                    rng=jax.random.key(seed))


# ----------------------------------------------------------------------------- activation dropout

def _dense_ref(x, dense):
  kernel = np.asarray(dense.kernel[...], np.float64)
  return (x @ kernel.reshape(x.shape[-1], -1)).reshape(*x.shape[:-1], *kernel.shape[1:]) + (
      np.asarray(dense.bias[...]))


@pytest.mark.parametrize('activation', ['relu', 'swiglu'])
def test_activation_dropout_equation(activation):
  """FFN(x) = Dropout(act(x W_1 + b_1)) W_2 + b_2: the hidden units `[..., d_ff]` dropped (the
  gated FFN's product), kept ones scaled by 1/(1 - rate); no key: the plain FFN."""
  rate, key = 0.25, jax.random.key(7)
  ffn = layers.FeedForward(8, 12, activation=activation, dropout_rate=rate, rngs=nnx.Rngs(0))
  x = np.random.RandomState(2).randn(3, 8)
  h = _dense_ref(x, ffn.wi)
  if activation == 'relu':
    hidden = np.maximum(h, 0)
  else:
    gate, up = h[:, 0], h[:, 1]
    hidden = gate / (1 + np.exp(-gate)) * up
  keep = np.asarray(hashed_bits(key, (3, 12)) < keep_threshold(rate))
  assert 0 < keep.sum() < keep.size
  wo, bo = np.asarray(ffn.wo.kernel[...], np.float64), np.asarray(ffn.wo.bias[...])
  x32 = jnp.asarray(x, jnp.float32)
  np.testing.assert_allclose(ffn(x32, key), (hidden * keep / (1 - rate)) @ wo + bo,
                             rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(ffn(x32), hidden @ wo + bo, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('kind', KINDS)
def test_activation_dropout_acts_in_training_only(kind):
  """The same parameters (drawn from the same keys); inference (deterministic) unchanged, so
  the KV cache and the exports are the plain model's; training draws other outputs."""
  fields = {**TINY, **KINDS[kind]}
  plain, dropped = build_model(fields), build_model({**fields, 'activation_dropout_rate': 0.3})
  a, b = jax.tree.leaves(_params(plain)), jax.tree.leaves(_params(dropped))
  assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
  args = (_tokens(1, (2, 7)), _tokens(2, (2, 6))) if kind == 'encoder_decoder' else (
      _tokens(1, (2, 7)),)
  # Each pass under jit (`call`): a program per model and mode, not an op-by-op run.
  np.testing.assert_array_equal(call(plain, *args), call(dropped, *args))
  key = jax.random.key(0)
  train_plain = call(plain, *args, deterministic=False, dropout_rng=key)
  assert not np.allclose(train_plain, call(dropped, *args, deterministic=False, dropout_rng=key))
  # The off value: the same masks everywhere else (a new site's key comes after the others').
  off = build_model({**fields, 'activation_dropout_rate': 0.0})
  np.testing.assert_array_equal(train_plain,
                                call(off, *args, deterministic=False, dropout_rng=key))
  if kind == 'encoder_decoder':
    assert_cache_equals_full_forward(dropped)


def test_activation_dropout_is_exported_where_the_target_has_it():
  """A training-only rate: every export computes the trained model (no refusal); Marian's
  config carries it (its `activation_dropout`, read back by import.py); GPT-2's, BERT's and
  CTranslate2's have no such field, and inference does not need one."""
  config = ModelConfig.from_config({**TINY, 'activation_dropout_rate': 0.1})
  targets.check_exportable(config)
  ct2_export.check(config)
  hf = convert.seq2seq_config(config, eos_id=1)
  assert hf['activation_dropout'] == 0.1
  sd = {'final_logits_bias': np.zeros((1, config.vocab_size), np.float32)}
  assert architectures.marian_model(hf, sd)['activation_dropout_rate'] == 0.1
  lm = ModelConfig.from_config({**TINY, **KINDS['decoder_only'], 'norm_position': 'pre',
                                'positional_encoding': 'learned',
                                'activation_dropout_rate': 0.1})
  targets.check_exportable(lm)
  ct2_export.check(lm)


# ----------------------------------------------------------------------------- R-Drop

def test_symmetric_kl_equation():
  rng = np.random.RandomState(0)
  a, b = rng.randn(2, 3, 7) * 2, rng.randn(2, 3, 7) * 2

  def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
  la, lb = log_softmax(a), log_softmax(b)
  kl_ab = (np.exp(la) * (la - lb)).sum(-1)
  kl_ba = (np.exp(lb) * (lb - la)).sum(-1)
  a32, b32 = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  for kl in (symmetric_kl, symmetric_kl_reference):
    np.testing.assert_allclose(kl(a32, b32), kl_ab + kl_ba, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kl(a32, a32), 0.0, atol=1e-6)
  # The fused gradient (closed form) is autodiff's of the formula, to both sides.
  w = jnp.asarray(rng.rand(2, 3), jnp.float32)

  def grads(kl):
    return jax.grad(lambda x, y: (kl(x, y) * w).sum(), argnums=(0, 1))(a32, b32)
  for fused, reference in zip(grads(symmetric_kl), grads(symmetric_kl_reference), strict=True):
    np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_rdrop_step_equation(kind):
  """One R-Drop step (SGD, learning rate 1) moves the parameters by minus the gradient of
  [1/2 (CE_1 + CE_2) + alpha/4 (KL(P1 || P2) + KL(P2 || P1))] summed over the non-pad
  targets / their count, the passes' dropout keys split from the step's key; the reported
  loss is the passes' mean cross-entropy, `rdrop_kl` the mean symmetric KL (NumPy)."""
  alpha, smoothing = 5.0, 0.1
  config = ModelConfig.from_config({**TINY, **KINDS[kind]})
  tx = optax.sgd(1.0)
  state, batch = _state(config, tx), _batch(kind)
  step = steps.make_train_step(config, tx, lambda s: 1.0, label_smoothing=smoothing,
                               rdrop_alpha=alpha)
  new, metrics = jax.jit(step)(state, batch)
  keys = list(jax.random.split(jax.random.fold_in(state.rng, state.step)))  # concrete
  weights = np.asarray(steps.target_weights(batch), np.float64)
  targets_ = batch['targets']

  def passes(params):
    return [steps.apply_model(config, params, batch, deterministic=False, dropout_rng=k)
            for k in keys]

  def objective(params):
    first, second = passes(params)
    w = steps.target_weights(batch)
    ce = (smoothed_cross_entropy(first, targets_, smoothing) +
          smoothed_cross_entropy(second, targets_, smoothing)) / 2
    logp_1, logp_2 = jax.nn.log_softmax(first), jax.nn.log_softmax(second)
    kl = (jnp.exp(logp_1) * (logp_1 - logp_2)).sum(-1) + (
        jnp.exp(logp_2) * (logp_2 - logp_1)).sum(-1)
    return ((ce + alpha / 4 * kl) * w).sum() / w.sum(), (first, second)
  # One program for the gradient and the passes' logits (auxiliary outputs), not two.
  grads, logits = jax.jit(jax.grad(objective, has_aux=True))(state.params)
  for got, p, g in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params),
                       jax.tree.leaves(grads), strict=True):
    np.testing.assert_allclose(got, p - g, atol=2e-5)
  # The metrics from the two passes' logits, in float64.
  first, second = (np.asarray(x, np.float64) for x in logits)

  def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
  lp1, lp2 = log_softmax(first), log_softmax(second)
  tokens = weights.sum()
  ce = [np.asarray(smoothed_cross_entropy(jnp.asarray(x), targets_, smoothing), np.float64)
        for x in (first, second)]
  assert float(metrics['loss']) == pytest.approx(((ce[0] + ce[1]) / 2 * weights).sum() / tokens,
                                                 rel=1e-5)
  kl = ((np.exp(lp1) - np.exp(lp2)) * (lp1 - lp2)).sum(-1)
  assert float(metrics['rdrop_kl']) == pytest.approx((kl * weights).sum() / tokens, rel=1e-4)
  assert float(metrics['rdrop_kl']) > 0  # two different masks
  assert float(metrics['num_tokens']) == tokens


def test_rdrop_alpha_zero_is_the_plain_step():
  """alpha = 0 is a Python branch: the same program as a step built without R-Drop (one
  pass, no `rdrop_kl`); with grad accumulation, R-Drop sums the micro-batches' KL too."""
  config = ModelConfig.from_config(TINY)
  tx = optax.adam(1e-3)
  state, batch = _state(config, tx), _batch('encoder_decoder')

  def program(**kwargs):
    step = steps.make_train_step(config, tx, lambda s: 1e-3, label_smoothing=0.1, **kwargs)
    return jax.jit(step).lower(state, batch).as_text()
  assert program(rdrop_alpha=0.0) == program()
  accum = steps.make_train_step(config, tx, lambda s: 1e-3, label_smoothing=0.1,
                                grad_accum_steps=2, rdrop_alpha=1.0)
  _, metrics = jax.jit(accum)(state, batch)
  assert bool(metrics['finite']) and float(metrics['rdrop_kl']) > 0


def test_rdrop_and_activation_dropout_resume_exactly(tmp_path, kind='encoder_decoder'):
  """train.py with both on: a run stopped at step 3 and resumed ends bitwise where the
  uninterrupted run ends (the passes' keys come from the checkpointed key and the step).
  The trainer's key and step are the same for every kind: the language model's passes take
  theirs from the same (key, step) as test_rdrop_step_equation[decoder_only] checks, so one
  kind resumes here. (The encoder-only model does not train: config_check's
  TRAINABLE_KINDS.)"""
  overrides = {'model.dropout_rate': 0.1, 'model.activation_dropout_rate': 0.2,
               'train.rdrop_alpha': 1.0}
  whole = syn.run(str(tmp_path / 'whole'), kind, overrides)
  split = str(tmp_path / 'split')
  syn.run(split, kind, {**overrides, 'train.num_steps': 3})
  resumed = syn.run(split, kind, overrides)
  for a, b in zip(jax.tree.leaves(whole['state'].params), jax.tree.leaves(resumed['state'].params),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  assert whole['losses'][6] == resumed['losses'][6]


# ----------------------------------------------------------------------------- config

def test_the_fields_are_checked_and_shown():
  with pytest.raises(ConfigError, match=r'activation_dropout_rate=1\.0 must be in \[0, 1\)'):
    ModelConfig.from_config({**TINY, 'activation_dropout_rate': 1.0})
  for bad in (-0.5, float('inf'), True):
    with pytest.raises(ConfigError, match='config.train.rdrop_alpha'):
      schema.TrainConfig.from_config({**default.get_config().train.to_dict(), 'rdrop_alpha': bad})
  from configs import resolve, show  # pylint: disable=import-outside-toplevel
  table = show.table(*resolve.resolve('configs/default.py'), 'configs/default.py')
  for field in ('model.activation_dropout_rate', 'train.rdrop_alpha'):
    (line,) = [line for line in table.splitlines() if line.split()[:1] == [field]]
    assert len(line.split()) > 4, line  # value, origin and a doc
