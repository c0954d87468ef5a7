"""Accelerator settings and run telemetry: precision/determinism config, MFU, profiler traces."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from common import accelerator
from model.build import param_shapes
from model.config import ConfigError, ModelConfig
from tests.training import test_train_synthetic as syn
from training import config_check, steps, telemetry

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)


# ----------------------------------------------------------------------------- FLOPs and MFU

def _dot_flops(jaxpr) -> int:
  """2 x multiply-adds of every dot_general in `jaxpr` (sub-jaxprs included; scans x length)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contract, _), (lhs_batch, _) = eqn.params['dimension_numbers']
      lhs, out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
      total += 2 * int(np.prod(out)) * int(np.prod([lhs[d] for d in lhs_contract]))
    times = eqn.params.get('length', 1) if eqn.primitive.name == 'scan' else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          total += times * _dot_flops(inner)
  return total


@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_analytic_flops_equal_the_matmuls_of_the_gradient(kind):
  """`train_step_flops` counts exactly the matmul FLOPs that forward + backward trace (the
  logits' custom VJP included), so MFU is not a guess."""
  config = ModelConfig.from_config(dict(
      kind=kind, vocab_size=48, num_encoder_layers=2, num_decoder_layers=3, d_model=32,
      num_heads=4, d_ff=64, max_len=32, dropout_rate=0.0))
  batch = {'inputs': jnp.ones((2, 7), jnp.int32), 'targets': jnp.ones((2, 5), jnp.int32)}
  if kind == 'decoder_only':
    del batch['inputs']
  params = param_shapes(config)

  def loss(p):
    return steps.apply_model(config, p, batch, deterministic=True).sum()

  traced = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
  shapes = {k: v.shape for k, v in batch.items()}
  assert telemetry.train_step_flops(config, shapes) == _dot_flops(traced)


def test_peak_table_and_mfu():
  assert telemetry.peak_flops('NVIDIA H100 80GB HBM3', 'bfloat16') == 989.4e12
  assert telemetry.peak_flops('NVIDIA H100 PCIe', 'bfloat16') == 756e12
  assert telemetry.peak_flops('NVIDIA H200', 'float32') == 494.7e12
  assert telemetry.peak_flops('NVIDIA L40S', 'bfloat16') is None  # not an L4
  assert telemetry.peak_flops('TPU v5 lite', 'bfloat16') == 197e12
  assert telemetry.peak_flops('TPU v5p', 'bfloat16') == 459e12
  assert telemetry.peak_flops('cpu', 'float32') is None

  class H100:
    device_kind = 'NVIDIA H100 80GB HBM3'
  assert telemetry.mfu(989.4e12 * 0.5, 1.0, 'bfloat16', [H100()]) == pytest.approx(0.5)
  assert telemetry.mfu(989.4e12, 1.0, 'bfloat16', [H100(), H100()]) == pytest.approx(0.5)
  assert telemetry.mfu(1e12, 1.0, 'float32', jax.devices('cpu')) is None  # no peak, no MFU


def test_profile_steps_parsing():
  assert telemetry.parse_profile_steps('') is None
  assert telemetry.parse_profile_steps('5,10') == (5, 10)
  for bad in ('5', '10,5', '0,3', 'a,b', '1,2,3'):
    with pytest.raises(ValueError):
      telemetry.parse_profile_steps(bad)


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize('field,value,message', [
    ('matmul_precision', 'fast', 'config.train.matmul_precision'),
    ('deterministic', 'yes', 'config.train.deterministic'),
])  # (profile_steps='9,3': test_config_schema's test_each_section_refuses_a_bad_value_in_one_line)
def test_bad_accelerator_settings_are_refused(field, value, message):
  values = syn.tiny_config('encoder_decoder').to_dict()
  values['train'][field] = value  # as a hand-edited config.json could hold it
  config = ml_collections.ConfigDict(values)
  with pytest.raises(ConfigError, match=message):
    config_check.validate_config(config)


def test_matmul_precision_reaches_the_compiled_matmuls():
  f = jax.jit(lambda a, b: a @ b)
  a = jnp.ones((4, 4))
  with accelerator.matmul_precision('high'):
    assert 'HIGH' in f.lower(a, a).as_text()
  with accelerator.matmul_precision('default'):  # leaves the suite's setting alone
    assert 'HIGHEST' in f.lower(a, a).as_text()


def test_deterministic_flag_is_added_once(monkeypatch):
  flag = accelerator.DETERMINISTIC_XLA_FLAG
  assert accelerator.with_deterministic_flag('') == flag
  assert accelerator.with_deterministic_flag('--a=1') == f'--a=1 {flag}'
  assert accelerator.with_deterministic_flag(f'--a=1 {flag}') == f'--a=1 {flag}'
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  accelerator.request_deterministic_ops()
  assert os.environ['XLA_FLAGS'].split() == ['--xla_force_host_platform_device_count=1', flag]
  accelerator.check_deterministic(True)  # CPU: deterministic already, nothing to refuse


# ----------------------------------------------------------------------------- in a run

def test_run_logs_step_time_and_writes_a_profile(tmp_path, capsys):
  summary = syn.run(str(tmp_path), 'decoder_only',
                    {'train.num_steps': 4, 'train.log_every_steps': 2,
                     'train.checkpoint_every_steps': 100, 'train.profile_steps': '2,3',
                     'train.matmul_precision': 'highest'})
  assert summary['step'] == 4
  out = capsys.readouterr().out
  assert 'compiling the train step ...' in out and 'compiled the train step in' in out
  assert 'step 4/4' in out and 'ms/step' in out
  assert 'matmul precision highest' in out
  traces = [name for _, _, names in os.walk(tmp_path / 'profile') for name in names]
  assert any(name.endswith('.xplane.pb') for name in traces), traces
