"""FSDP and tensor parallelism: the same training on every mesh of 8 simulated
devices as on 1, per-device memory, checkpoints across meshes, bad meshes refused.

`python -m tests.training.test_sharding OUT.json` (8 devices) trains the same 5 steps on each mesh
and writes the losses and per-device bytes; the tests compare them.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.training import test_train_synthetic as syn

# (data, fsdp, tensor): every axis at once, and the widest split of the parameters (8 ways,
# tensor 4). Data parallelism alone (8, 1, 1) is test_train_distributed's 8-device run against
# one device, and data x fsdp (2, 4, 1) its checkpoints across meshes.
MESHES = [(2, 2, 2), (1, 2, 4)]
KINDS = ('encoder_decoder', 'decoder_only')
TINY = {'vocab_size': 128, 'd_model': 128, 'num_heads': 4, 'd_ff': 256, 'max_len': 16,
        'num_encoder_layers': 1, 'num_decoder_layers': 1, 'positional_encoding': 'learned'}
# The language model stacks its 2 layers (jax.lax.scan): the 'layers' axis is covered too.
LM = {'num_decoder_layers': 2, 'scan_layers': True}
compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)


def _config(kind: str):
  from configs import base  # pylint: disable=import-outside-toplevel
  config = base.base_config()
  config.model.update(kind=kind, dropout_rate=0.1, **TINY)
  if kind == 'decoder_only':
    config.model.update(**LM)
  config.optimizer.update(name='adamw', weight_decay=0.1, warmup_steps=2)
  return config


def _batches(kind: str, n: int = 5):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    batch = {'targets': rng.integers(1, 64, (16, 12)).astype(np.int32)}
    if kind == 'encoder_decoder':
      batch['inputs'] = rng.integers(1, 64, (16, 12)).astype(np.int32)
    out.append(batch)
  return out


def _train(kind: str, mesh_shape) -> tuple[list[float], dict[str, int]]:
  """5 train steps on `mesh_shape` -> (losses, per-device and total bytes of the state)."""
  import jax  # pylint: disable=import-outside-toplevel

  import optim  # pylint: disable=import-outside-toplevel
  from model import ModelConfig, partitioning  # pylint: disable=import-outside-toplevel
  from training import memory, mesh as mesh_lib, state as state_lib, steps  # pylint: disable=import-outside-toplevel
  config = _config(kind)
  module, schedule = ModelConfig.from_config(config.model), optim.make_schedule(config)
  tx = optim.make_optimizer(config, schedule)
  mesh = mesh_lib.make_mesh(int(np.prod(mesh_shape)),
                            dict(zip(partitioning.MESH_AXES, mesh_shape, strict=True)))
  state = state_lib.create_train_state(module, tx, 0, mesh)
  held = (state.params, state.opt_state)
  sizes = {'per_device': memory.per_device_bytes(held),
           'total': sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(held))}
  step = steps.jit_train_step(module, tx, schedule, mesh, label_smoothing=0.1)
  losses = []
  for batch in _batches(kind):
    state, metrics = step(state, mesh_lib.shard_batch(batch, mesh))
    losses.append(float(metrics['loss']))
  return losses, sizes


def _encoder_only_outputs(mesh_shape) -> list:
  """The encoder-only model's forward pass with its parameters sharded on `mesh_shape`."""
  import jax  # pylint: disable=import-outside-toplevel

  from model import bind, build_model, params_of, partitioning  # pylint: disable=import-outside-toplevel
  from training import mesh as mesh_lib, state as state_lib  # pylint: disable=import-outside-toplevel
  module = build_model({**TINY, 'kind': 'encoder_only'})
  config, params = module.config, params_of(module)
  tokens = _batches('decoder_only', 1)[0]['targets']
  mesh = mesh_lib.make_mesh(int(np.prod(mesh_shape)),
                            dict(zip(partitioning.MESH_AXES, mesh_shape, strict=True)))
  params = jax.device_put(params, state_lib.param_shardings(config, mesh))
  rules = mesh_lib.rules()

  @jax.jit
  def forward(params, tokens):
    with partitioning.activation_sharding(mesh, rules):
      return bind(config, params)(tokens)

  tokens = jax.device_put(tokens, mesh_lib.batch_sharding(mesh))
  return np.asarray(forward(params, tokens)).tolist()


def main(out_path: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  syn.enable_compilation_cache()
  assert jax.device_count() == 8
  result = {}
  for kind in KINDS:
    for shape in [(1, 1, 1)] + MESHES:
      losses, sizes = _train(kind, shape)
      result[f'{kind} {shape}'] = {'losses': losses, **sizes}
  for shape in [(1, 1, 1)] + MESHES:
    result[f'encoder_only {shape}'] = _encoder_only_outputs(shape)
  with open(out_path, 'w') as f:
    json.dump(result, f)


@pytest.fixture(scope='module')
def mesh_runs(tmp_path_factory):
  import subprocess  # pylint: disable=import-outside-toplevel
  out = str(tmp_path_factory.mktemp('meshes') / 'result.json')
  proc = subprocess.run([sys.executable, '-m', __name__, out],
                        env=syn.subprocess_env(8), capture_output=True, text=True,
                        cwd=syn.REPO)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(out) as f:
    return json.load(f)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('mesh', MESHES)
def test_every_mesh_gives_the_one_device_loss_curve(mesh_runs, kind, mesh):
  one = mesh_runs[f'{kind} (1, 1, 1)']['losses']
  losses = mesh_runs[f'{kind} {tuple(mesh)}']['losses']
  # The first loss is one forward pass: only the reductions' order differs. Later ones follow
  # Adam's updates, which amplify that (measured: 1.3e-5 at step 5 on an Intel AVX-512 VM,
  # within 1e-5 on AMD); a sharding error (a sum counted twice, a missing all-reduce) moves
  # a loss by more than 1e-2.
  np.testing.assert_allclose(losses[0], one[0], rtol=1e-5)
  np.testing.assert_allclose(losses, one, rtol=1e-4)
  assert one[-1] < one[0]


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('mesh', MESHES)
def test_parameters_and_optimizer_state_are_split_over_fsdp_x_tensor(mesh_runs, kind, mesh):
  """Per-device bytes within 10% of total / (fsdp x tensor): only LayerNorm scales and a
  few biases stay whole."""
  run = mesh_runs[f'{kind} {tuple(mesh)}']
  ideal = run['total'] / (mesh[1] * mesh[2])
  assert ideal <= run['per_device'] <= 1.1 * ideal


@pytest.mark.parametrize('mesh', MESHES)
def test_encoder_only_forward_is_the_same_on_sharded_parameters(mesh_runs, mesh):
  np.testing.assert_allclose(mesh_runs[f'encoder_only {mesh}'],
                             mesh_runs['encoder_only (1, 1, 1)'], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('changes,message', [
    ({'mesh.fsdp': 3}, 'config.mesh (data, fsdp, tensor)=(-1, 3, 1): 8 devices are not '
                       'divisible by 3'),
    ({'mesh.data': 2, 'mesh.fsdp': 2}, 'config.mesh (data, fsdp, tensor)=(2, 2, 1) has 4 '
                                       'devices; this run has 8'),
    ({'mesh.fsdp': -1}, 'config.mesh: only one of data/fsdp/tensor may be -1'),
    ({'mesh.tensor': 8}, 'config.model.num_heads=4 is not divisible by config.mesh.tensor=8'),
    ({'mesh.tensor': 4, 'model.d_ff': 258},
     'config.model.d_ff=258 is not divisible by config.mesh.tensor=4'),
    ({'mesh.fsdp': 4, 'train.batch_size': 6},
     'config.train.batch_size=6 must be divisible by config.mesh data x fsdp (2 x 4)'),
    ({'mesh.rules.embed': 'tensor,model'},
     "config.mesh.rules.embed='tensor,model': ['model'] are not mesh axes"),
])
def test_bad_mesh_is_one_line_naming_the_field(changes, message):
  from model.config import ConfigError  # pylint: disable=import-outside-toplevel
  from training import config_check  # pylint: disable=import-outside-toplevel
  config = _config('encoder_decoder')
  config.train.batch_size = 16
  syn.set_fields(config, changes)
  with pytest.raises(ConfigError) as info:
    config_check.validate_config(config, num_devices=8)
  assert message in str(info.value) and '\n' not in str(info.value)


def test_unknown_logical_axis_in_the_rules_is_refused():
  from model.config import ConfigError  # pylint: disable=import-outside-toplevel
  from training import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  with pytest.raises(ConfigError, match=r"config.mesh.rules.hidden: unknown logical axis; "
                                        r"known: \['vocab', 'embed'"):
    mesh_lib.rules({'rules': {'hidden': 'tensor'}})


if __name__ == '__main__':
  main(sys.argv[1])
