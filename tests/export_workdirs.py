"""What the export tests (test_export_hf, test_export_ct2, test_export_safety) and the
decode-engines bench test share: trained workdirs, each trained once per test run (shared by
the xdist workers: `shared_dirs.built_once`) and reused by every module that asks for it
(tests must not modify them: copy first), and tiny random models."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import default
from model import bind, build_model, params_of
from tests import REPO
from tests.shared_dirs import built_once

# A small Multi30k model trained to write real (EOS-ended) sentences, 2 checkpoints (~20 s).
MT = ('configs/default.py:tiny', '--config.model.d_model=64', '--config.model.d_ff=256',
      '--config.train.num_steps=200', '--config.train.batch_size=32',
      '--config.optimizer.warmup_steps=100', '--config.train.checkpoint_every_steps=125',
      '--config.train.eval_every_steps=200', '--config.train.num_eval_batches=1',
      '--config.decode.num_eval_sentences=0')
CHARS = list(" !',.:;?ETAOINSHRDLUetaoinshrdlucmwfgypbvk\n")  # a character vocabulary


# conftest.SUITE_XLA_FLAGS' quick-compile flags: they halve the speed of a 250-step training
# (~25 s more CPU than XLA's defaults), whose programs nothing in the suite compares with.
QUICK_COMPILE_FLAGS = ('--xla_backend_optimization_level', '--xla_cpu_use_fusion_emitters')


def env(optimized: bool = False) -> dict:
  """The suite's environment for a subprocess; `optimized`: XLA's default optimisations."""
  environ = dict(os.environ)
  environ['PYTHONPATH'] = REPO + os.pathsep + environ.get('PYTHONPATH', '')
  environ.setdefault('JAX_PLATFORMS', 'cpu')
  if optimized:
    environ['XLA_FLAGS'] = ' '.join(f for f in environ.get('XLA_FLAGS', '').split()
                                    if not f.startswith(QUICK_COMPILE_FLAGS))
  return environ


def trained(tmp_path_factory, name: str, recipe=MT) -> str:
  """The workdir `name` trained with `recipe` (config, overrides...): trained by the first test
  of the run that asks for it (whichever xdist worker), then shared."""
  def build(root) -> dict:
    workdir = root / 'workdir'
    config, *overrides = recipe
    cmd = [sys.executable, os.path.join(REPO, 'train.py'), f'--config={config}',
           f'--workdir={workdir}', *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env(optimized=True), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, f'training failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}'
    return {'workdir': str(workdir)}
  return built_once(tmp_path_factory, f'export_workdirs_{name}', build)['workdir']


def exported_hf(tmp_path_factory) -> tuple[str, str]:
  """(directory, summary line): the average of the 'mt' workdir's last 2 checkpoints exported
  in transformers' format (in this process), once per test run for every module that asks
  (test_export_hf, test_import_hf; tests must not modify it: copy first)."""
  workdir = trained(tmp_path_factory, 'mt')

  def build(root) -> dict:
    from hf_export import writer  # pylint: disable=import-outside-toplevel
    out = str(root / 'hf')
    return {'dir': out, 'summary': writer.export_workdir(workdir, out, average_last=2)}
  built = built_once(tmp_path_factory, 'export_workdirs_mt_hf', build)
  return built['dir'], built['summary']


def two_layer_translation_config():
  """configs/default.py:tiny's model with 2 encoder and 2 decoder layers (the preset has 1):
  an export's layer numbering is checked beyond layer 0."""
  config = default.get_config('tiny').model
  config.num_encoder_layers = config.num_decoder_layers = 2
  return config


def random_model(config, seed=0):
  """(model, params): a tiny model with every weight, LayerNorm and bias random (not 0/1);
  `model` holds `params` (`model.params_of`'s pure dict of NumPy arrays)."""
  built = build_model(config, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed)  # NumPy: one jitted draw per shape would compile ~100 times
  params = jax.tree.map(lambda p: np.asarray(p) + 0.2 * rng.standard_normal(p.shape, np.float32),
                        params_of(built))
  return bind(built.config, jax.tree.map(jnp.asarray, params)), params
