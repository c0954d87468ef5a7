"""Unit tests of the training pieces: schedules, loss, config validation, workdir checks."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optim
from model import build_model, params_of
from model.build import count_params
from model.config import ConfigError
from optim import schedules
from tests.training.test_train_synthetic import tiny_config
from training import config_check, losses, mesh as mesh_lib, state as state_lib, steps
from training.state import TrainState
from workdir import config_io


def paper_rate(step, d_model, warmup):
  """Vaswani et al. 2017, eq. 3 (steps counted from 1)."""
  return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize('d_model,warmup', [(512, 4000), (1024, 4000), (256, 800)])
def test_rsqrt_schedule_matches_paper(d_model, warmup):
  schedule = schedules.rsqrt_schedule(2.0, d_model, warmup)
  for step in [1, 2, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup, 100_000]:
    # Optax counts updates from 0: update `step - 1` uses the paper's step `step`.
    np.testing.assert_allclose(schedule(step - 1), 2.0 * paper_rate(step, d_model, warmup),
                               rtol=1e-6)
  assert schedule(0) > 0
  rates = [float(schedule(s)) for s in range(0, 3 * warmup, 37)]
  peak = int(np.argmax(rates)) * 37
  assert abs(peak - (warmup - 1)) <= 37


def test_rsqrt_schedule_from_config():
  config = tiny_config()
  config.model.d_model, config.optimizer.warmup_steps, config.optimizer.learning_rate = 64, 10, 1.5
  schedule = optim.make_schedule(config)
  np.testing.assert_allclose(schedule(9), 1.5 * paper_rate(10, 64, 10), rtol=1e-6)


def test_cosine_and_constant_schedules():
  schedule = schedules.cosine_schedule(1e-3, warmup_steps=10, num_steps=110, min_ratio=0.1)
  assert 0 < schedule(0) < schedule(5) < schedule(9)
  np.testing.assert_allclose(schedule(9), 1e-3, rtol=1e-6)  # the 10th update: the peak
  k = 1  # the decay's k-th update (count 9 + k) is at floor + (peak - floor)(1 + cos(pi k/100))/2
  np.testing.assert_allclose(schedule(9 + k), 1e-4 + 0.9e-3 * (1 + np.cos(np.pi * k / 100)) / 2,
                             rtol=1e-5)
  np.testing.assert_allclose(schedule(59), 0.55e-3, rtol=1e-5)  # half way down
  # The run's last update (count num_steps - 1) takes the floor (it came one update later).
  np.testing.assert_allclose(schedule(109), 1e-4, rtol=1e-5)
  assert schedule(108) > 1e-4 * (1 + 1e-4)
  np.testing.assert_allclose(schedule(500), 1e-4, rtol=1e-5)
  assert all(schedule(s) > schedule(s + 1) for s in range(9, 109, 7))
  constant = schedules.constant_schedule(3e-4, warmup_steps=0)
  np.testing.assert_allclose([constant(0), constant(1000)], [3e-4, 3e-4], rtol=1e-6)


def test_smoothed_cross_entropy():
  vocab, ls = 7, 0.1
  targets = jnp.array([[1, 3, 6]])
  # A model predicting exactly the smoothed distribution has loss 0.
  smoothed = jnp.full((1, 3, vocab), ls / (vocab - 1)).at[0, jnp.arange(3), targets[0]].set(1 - ls)
  loss = losses.smoothed_cross_entropy(jnp.log(smoothed), targets, ls)
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)
  # Without smoothing it is the usual cross-entropy.
  logits = jax.random.normal(jax.random.PRNGKey(0), (1, 3, vocab))
  np.testing.assert_allclose(losses.smoothed_cross_entropy(logits, targets, 0.0),
                             optax.softmax_cross_entropy_with_integer_labels(logits, targets),
                             rtol=1e-6)
  # Smoothed loss = KL(smoothed || model) >= 0.
  assert (losses.smoothed_cross_entropy(logits, targets, ls) >= -1e-6).all()


def test_target_weights():
  batch = {'targets': jnp.array([[4, 5, 0]])}
  np.testing.assert_array_equal(steps.target_weights(batch), [[1, 1, 0]])
  batch['targets_weights'] = jnp.array([[0.0, 1.0, 1.0]])
  np.testing.assert_array_equal(steps.target_weights(batch), [[0, 1, 1]])


@pytest.mark.parametrize('field,value,match', [
    ('optimizer.name', 'sgd', r'config\.optimizer\.name'),
    ('optimizer.schedule', 'linear', r'config\.optimizer\.schedule'),
    ('optimizer.learning_rate', -1.0, r'config\.optimizer\.learning_rate'),
    ('optimizer.weight_decay', 0.1, r'config\.optimizer\.weight_decay.*adamw'),
    ('train.batch_size', 0, r'config\.train\.batch_size'),
    ('train.batch_size', 9, r'config\.train\.batch_size=9 must be divisible'),
    ('train.grad_accum_steps', 3, r'config\.train\.batch_size=8 must be divisible'),
    ('train.label_smoothing', 1.0, r'config\.train\.label_smoothing'),
    ('train.num_steps', 0, r'config\.train\.num_steps'),
    ('model.num_heads', 5, r'config\.model\.d_model=32 is not divisible'),
    ('model.kind', 'encoder_only', r'config\.model\.kind'),
    ('model.dtype', 'float16', r'config\.model\.dtype'),
    ('data.max_length', 40, r'config\.model\.max_len >= 40'),
    ('decode.beam_size', 0, r'config\.decode\.beam_size'),
])
def test_validate_config_names_the_field(field, value, match):
  config = tiny_config(**{field: value})
  with pytest.raises(ConfigError, match=match):
    config_check.validate_config(config, num_devices=2)


def test_validate_config_accepts_presets():
  from configs import default, lm_1b, multi30k, shakespeare_char, wmt14_base, wmt14_big
  for module, presets in [(default, [None, 'tiny']),
                          (multi30k, [None, 'gpu', *multi30k.OVERRIDES]),
                          (shakespeare_char, [None, 'tiny', 'large']), (wmt14_base, [None]),
                          (wmt14_big, [None]), (lm_1b, [None])]:
    for preset in presets:
      config_check.validate_config(module.get_config(preset) if preset else module.get_config())


def test_lm_1b_preset_has_about_1b_parameters_and_fits_8_and_64_devices():
  """configs/lm_1b.py: its size (no arrays: eval_shape) and the meshes of
  bench/results/sharding.md's table pass validation (heads, d_ff and the batch divide)."""
  from configs import lm_1b
  from training import state as state_lib
  config = lm_1b.get_config()
  model_config = config_check.validate_config(config)
  shapes = jax.eval_shape(state_lib.make_init_fn(model_config, optax.identity()),
                          state_lib.seed_key(0))
  assert 0.95e9 < count_params(shapes.params) < 1.05e9
  for data, fsdp, tensor in [(8, 1, 1), (1, 8, 1), (2, 1, 4), (1, 64, 1), (8, 8, 1), (16, 1, 4),
                             (2, 8, 4)]:
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = data, fsdp, tensor
    config_check.validate_config(config, num_devices=data * fsdp * tensor)


def test_config_roundtrip_and_compatibility(tmp_path):
  workdir = str(tmp_path)
  config = tiny_config()
  config_io.save_config(config, workdir)
  assert config_io.load_config(workdir).to_dict() == config.to_dict()
  # Other learning rate / steps: allowed, reported.
  changed = tiny_config(**{'optimizer.learning_rate': 0.25, 'train.num_steps': 99})
  diffs = config_check.check_compatible(changed, workdir)
  assert any('optimizer.learning_rate' in d for d in diffs)
  assert any('train.num_steps' in d for d in diffs)
  # Another model shape: refused, config.json untouched.
  before = open(config_io.config_path(workdir)).read()
  with pytest.raises(config_check.IncompatibleWorkdirError, match=r'model\.d_model=32 \(new 64\)'):
    config_check.check_compatible(tiny_config(**{'model.d_model': 64}), workdir)
  assert open(config_io.config_path(workdir)).read() == before
  assert json.loads(before)['model']['d_model'] == 32
  # scan_layers stacks the parameters: another layout, refused.
  with pytest.raises(config_check.IncompatibleWorkdirError, match=r'model\.scan_layers=False'):
    config_check.check_compatible(tiny_config(**{'model.scan_layers': True}), workdir)
  # A config.json written before a model field existed had its default: still compatible.
  old = json.loads(before)
  del old['model']['scan_layers']
  with open(config_io.config_path(workdir), 'w') as f:
    json.dump(old, f)
  assert config_check.check_compatible(config, workdir) == []


def test_load_config_missing(tmp_path):
  with pytest.raises(ConfigError, match='config.json not found'):
    config_io.load_config(str(tmp_path))
  with open(os.path.join(tmp_path, 'config.json'), 'w') as f:
    f.write('{not json')
  with pytest.raises(ConfigError, match='not a readable config'):
    config_io.load_config(str(tmp_path))
  for not_a_config in ('[1, 2, 3]', 'null', '{"model": []}'):  # JSON, not sections: one line
    with open(os.path.join(tmp_path, 'config.json'), 'w') as f:
      f.write(not_a_config)
    with pytest.raises(ConfigError, match='config.json is not a config: a JSON object of '):
      config_io.load_config(str(tmp_path))


def test_load_config_gives_a_field_config_json_lacks_its_default(tmp_path):
  config_io.save_config(tiny_config(), str(tmp_path))
  with open(config_io.config_path(str(tmp_path))) as f:
    old = json.load(f)
  del old['train']['matmul_precision'], old['decode']['min_new_tokens'], old['mesh']
  with open(config_io.config_path(str(tmp_path)), 'w') as f:
    json.dump(old, f)
  loaded = config_io.load_config(str(tmp_path))
  assert loaded.train.matmul_precision == 'default' and loaded.decode.min_new_tokens == 1
  assert loaded.mesh.data == -1 and loaded.decode.beam_size == old['decode']['beam_size']


@pytest.mark.parametrize('label_smoothing', [0.0, 0.1])
def test_fused_cross_entropy_equals_reference_value_and_gradient(label_smoothing):
  vocab = 37
  logits = 3.0 * jax.random.normal(jax.random.PRNGKey(1), (2, 5, vocab))
  targets = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, vocab)
  weights = jax.random.uniform(jax.random.PRNGKey(3), (2, 5))
  loss, correct = losses.cross_entropy_and_accuracy(logits, targets, label_smoothing)
  np.testing.assert_allclose(
      loss, losses.smoothed_cross_entropy(logits, targets, label_smoothing), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(correct, logits.argmax(-1) == targets)

  def weighted(loss_fn):
    return lambda z: (loss_fn(z) * weights).sum()
  fused = weighted(lambda z: losses.cross_entropy_and_accuracy(z, targets, label_smoothing)[0])
  reference = weighted(lambda z: losses.smoothed_cross_entropy(z, targets, label_smoothing))
  np.testing.assert_allclose(jax.grad(fused)(logits), jax.grad(reference)(logits),
                             rtol=1e-5, atol=1e-7)
  # bfloat16 logits get a bfloat16 gradient.
  grad16 = jax.grad(lambda z: losses.cross_entropy_and_accuracy(
      z, targets, label_smoothing)[0].sum())(logits.astype(jnp.bfloat16))
  assert grad16.dtype == jnp.bfloat16


def test_train_step_skips_a_non_finite_gradient():
  module = build_model(dict(kind='decoder_only', vocab_size=11, num_decoder_layers=1, d_model=8,
                            num_heads=2, d_ff=16, max_len=8))
  batch = {'targets': jnp.array([[3, 4, 5, 6]])}
  params = params_of(module)
  tx = optax.adam(1e-3)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.PRNGKey(1))
  step = jax.jit(steps.make_train_step(module.config, tx, lambda s: 1e-3,
                                       label_smoothing=0.1))
  good, metrics = step(state, batch)
  assert bool(metrics['finite']) and int(good.step) == 1
  poisoned = state.replace(params=jax.tree.map(lambda p: p.at[(0,) * p.ndim].set(jnp.nan)
                                               if p.ndim == 2 else p, params))
  bad, metrics = step(poisoned, batch)
  assert not bool(metrics['finite']) and int(bad.step) == 0
  for new, old in zip(jax.tree.leaves(bad), jax.tree.leaves(poisoned), strict=True):
    np.testing.assert_array_equal(new, old)
  np.testing.assert_allclose(steps.parameter_norm(params), optax.tree.norm(params), rtol=1e-6)


def test_one_compiled_initialisation_starts_every_seed(monkeypatch):
  """The seed's key is the initialisation's argument, not a constant of its program: seeds 0
  and 1 compile one program (a sweep's later seeds read it from the compilation cache), and
  each gives the parameters and dropout key of its own `PRNGKey(seed)`."""
  config = build_model(dict(kind='decoder_only', vocab_size=11, num_decoder_layers=1, d_model=8,
                            num_heads=2, d_ff=16, max_len=8)).config
  tx, programs, jit = optax.adam(1e-3), [], jax.jit

  def recording_jit(fn, **kwargs):
    compiled = jit(fn, **kwargs)

    def call(*args):
      programs.append(compiled.lower(*args).as_text())
      return compiled(*args)
    return call
  monkeypatch.setattr(jax, 'jit', recording_jit)
  states = [state_lib.create_train_state(config, tx, seed, mesh_lib.make_mesh(1))
            for seed in (0, 1)]
  monkeypatch.undo()
  assert len(programs) == 2 and programs[0] == programs[1]
  init_params = jax.jit(lambda key: state_lib.init_params(config, key))
  for seed, state in zip((0, 1), states, strict=True):
    params_key, dropout_key = jax.random.split(jax.random.PRNGKey(seed))
    np.testing.assert_array_equal(state.rng, dropout_key)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(init_params(params_key)),
                         strict=True):
      np.testing.assert_array_equal(got, want)
  assert not np.array_equal(jax.tree.leaves(states[0].params)[-1],
                            jax.tree.leaves(states[1].params)[-1])


def test_evaluate_keeps_one_eval_program_in_flight():
  """Independent eval programs in flight together deadlocked XLA:CPU's collectives on several
  CPU devices (an all-reduce rendezvous timeout that aborts the process): evaluate() must wait
  for each batch before it dispatches the next."""
  from training import evaluation, mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  mesh = mesh_lib.make_mesh()
  rows = mesh_lib.local_batch_shards(mesh)

  @jax.jit
  def slow_eval_step(params, batch):  # ~0.1 s of matmuls: still running when the next is sent
    m = jax.lax.fori_loop(0, 100, lambda _, m: jnp.tanh(m @ m), jnp.full((256, 256), 1e-3))
    return {'loss': jnp.sum(batch['x'] * params) + 0 * m[0, 0], 'correct': jnp.sum(batch['x']),
            'num_tokens': jnp.float32(batch['x'].size)}

  returned = []

  def eval_step(params, batch):
    assert all(out['loss'].is_ready() for out in returned), 'an eval program was still running'
    returned.append(slow_eval_step(params, batch))
    return returned[-1]

  batches = [{'x': np.full((rows, 4), i, np.float32)} for i in range(5)]
  results = evaluation.evaluate(eval_step, jnp.float32(2.0), batches, mesh)
  assert len(returned) == 5
  assert results['num_tokens'] == 5 * rows * 4
  assert results['loss'] == pytest.approx(2.0 * sum(range(5)) * rows * 4 / (5 * rows * 4))
