"""The training loop in-process on synthetic data (tiny models, a few steps, CPU)."""

import os

import jax
import numpy as np
import pytest

from model.config import ConfigError
from tests.training import test_train_synthetic as syn
from training import trainer
from workdir import checkpoint

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)


def _mean(losses, steps):
  return float(np.mean([losses[s] for s in steps]))


# The decoder-only run computes in bfloat16 (a test of its own trained a third model for it:
# 3 steps with finite losses and float32 parameters); its float32 program trains in
# test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint and test_telemetry.
@pytest.mark.parametrize('kind,overrides', [
    ('encoder_decoder', {}),
    ('decoder_only', {'optimizer.learning_rate': 1e-2, 'model.dtype': 'bfloat16'}),
])
def test_few_steps_lower_the_loss(tmp_path, kind, overrides):
  summary = syn.run(str(tmp_path), kind, {'train.num_steps': 12, 'train.log_every_steps': 4,
                                          'train.checkpoint_every_steps': 100, **overrides})
  losses = summary['losses']
  assert all(np.isfinite(v) for v in losses.values())
  leaf = jax.tree.leaves(summary['state'].params)[0]
  assert leaf.dtype == np.float32  # parameters stay float32, whatever the compute dtype
  assert sorted(losses) == list(range(1, 13))
  assert _mean(losses, [10, 11, 12]) < _mean(losses, [1, 2, 3]) - 0.3, losses
  assert np.isfinite(summary['best_eval_loss'])
  assert checkpoint.list_steps(str(tmp_path)) == [12]  # the final checkpoint
  assert os.path.exists(tmp_path / 'config.json')
  assert any(name.startswith('events.out.tfevents') for name in os.listdir(tmp_path))


def test_grad_accumulation_matches_the_full_batch(tmp_path):
  """2 micro-batches of 4 give the same update as one batch of 8 (no dropout)."""
  overrides = {'train.num_steps': 3, 'model.dropout_rate': 0.0, 'train.log_every_steps': 1,
               'train.checkpoint_every_steps': 100}
  full = syn.run(str(tmp_path / 'full'), 'encoder_decoder', overrides)
  accum = syn.run(str(tmp_path / 'accum'), 'encoder_decoder',
                  {**overrides, 'train.grad_accum_steps': 2})
  # (Parameters are not compared: Adam's first steps are ~lr * sign(grad), which turns
  # float-rounding differences of near-zero gradients into differences of size lr.)
  np.testing.assert_allclose([full['losses'][s] for s in (1, 2, 3)],
                             [accum['losses'][s] for s in (1, 2, 3)], rtol=1e-4)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  workdir = str(tmp_path)
  overrides = {'train.num_steps': 8, 'train.checkpoint_every_steps': 2,
               'train.log_every_steps': 100}
  with pytest.raises(trainer.NonFiniteLossError, match=r'at step 5;.*checkpoint is step 4'):
    syn.run(workdir, 'decoder_only', overrides, nan_at=5)
  assert checkpoint.list_steps(workdir) == [2, 4]
  params, step = checkpoint.restore_params(workdir)
  assert step == 4
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


# A workdir of another model is refused before anything is written (config.json kept):
# test_train_cli's test_a_change_of_the_state_layout_is_refused_and_config_json_kept, through
# train.py on a shared workdir (a d_model change among them), not a run of its own here.


def test_bad_config_fails_before_anything_is_written(tmp_path):
  with pytest.raises(ConfigError, match=r'config\.optimizer\.schedule'):
    syn.run(str(tmp_path / 'w'), 'encoder_decoder', {'optimizer.schedule': 'linear'})
  assert not os.path.exists(tmp_path / 'w')
