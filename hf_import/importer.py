"""A `transformers` checkpoint directory -> a complete workdir (import.py).

  config.json   configs/base.py with the imported `config.model` and the tokenizer's fields
  tokenizer/    the checkpoint's tokenizer files (input_pipeline.pretrained_tokenizers)
  checkpoints/0 a train state at step 0 holding the imported parameters (Orbax, with the
                model's logical axes: it restores on any mesh), a fresh optimizer state

The workdir is written in a private directory beside its final path and renamed into place
once complete (`write_workdir`): a failed import leaves nothing behind, and nothing that was
there before is touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import tempfile

import jax
import numpy as np

from common.errors import ConfigError
from hf_import import architectures, checkpoint_dir
from hf_import.checkpoint_dir import ImportProblem
from hf_import.convert import vocab_order
from input_pipeline import pretrained_tokenizers as pretrained, tokenizers


@dataclasses.dataclass
class Imported:
  """What `load` read: the architecture, `config.model` fields, our parameters, tokenizer."""
  architecture: str
  model: dict
  params: dict
  tokenizer: object


def _marian_tokenizer(directory: str, hf: dict):
  settings = checkpoint_dir.read_json(directory, 'tokenizer_config.json', required=False)
  if settings.get('separate_vocabs'):
    raise ImportProblem(f'{directory}: separate_vocabs=True (a target_vocab.json of its own) '
                        'cannot be imported: one vocabulary serves source and target here')
  files = {name: checkpoint_dir.read_bytes(directory, name, 'a MarianTokenizer file')
           for name in pretrained.FILES['marian']}
  vocab = checkpoint_dir.read_json(directory, 'vocab.json')
  specials = {key: str(settings.get(f'{key}_token', default)) for key, default in
              (('eos', '</s>'), ('unk', '<unk>'), ('pad', '<pad>'))}
  missing = [token for token in specials.values() if token not in vocab]
  if missing:
    raise ImportProblem(f'{directory}/vocab.json has no {missing[0]!r} token')
  order = vocab_order(hf['vocab_size'], hf['pad_token_id'], hf['eos_token_id'],
                      vocab[specials['unk']])
  return pretrained.MarianTokenizer(files['source.spm'], files['target.spm'], vocab, order,
                                    specials)


def _huggingface_tokenizer(directory: str, hf: dict, kind: str):
  data = checkpoint_dir.read_bytes(directory, 'tokenizer.json', 'the fast tokenizer file '
                                   '(save the tokenizer with transformers to write it)')
  if kind == 'decoder_only':  # GPT-2: its BOS (<|endoftext|>) starts every text, as our pad
    start, eos = hf.get('bos_token_id'), hf.get('eos_token_id')
    order = vocab_order(hf['vocab_size'], start, None if eos == start else eos, None)
    eos = None if eos == start else eos
  else:  # an encoder: no EOS
    order, eos = vocab_order(hf['vocab_size'], hf.get('pad_token_id', 0), None, None), None
  try:
    return pretrained.HuggingFaceTokenizer(data, order, eos)
  except Exception as e:  # pylint: disable=broad-except
    raise ImportProblem(f'cannot read {directory}/tokenizer.json: {e}') from None


def load(directory: str) -> Imported:
  """Reads and converts the checkpoint in `directory`; raises ImportProblem or
  architectures.Unsupported (one line each)."""
  hf = checkpoint_dir.read_json(directory, 'config.json')
  arch = architectures.architecture(hf)
  sd = checkpoint_dir.state_dict(directory)
  if arch.prefix:
    sd = {k.removeprefix(arch.prefix): v for k, v in sd.items()}
  _check_against_config(directory, hf, arch, sd)
  try:
    fields = arch.model(hf, sd)
  except KeyError as e:
    raise ImportProblem(f'{directory}/config.json has no {e.args[0]!r}') from None
  tokenizer = (_marian_tokenizer(directory, hf) if arch.tokenizer == 'marian' else
               _huggingface_tokenizer(directory, hf, fields['kind']))
  from model import ModelConfig  # pylint: disable=import-outside-toplevel
  try:
    cfg = ModelConfig.from_config(fields)
  except ConfigError as e:
    raise ImportProblem(f'{directory}/config.json describes a model this project refuses: '
                        f'{e}') from None
  try:
    params = arch.params(sd, cfg, tokenizer.order)
  except KeyError as e:
    raise ImportProblem(f'{directory}: the checkpoint has no weight {e.args[0]!r}') from None
  except (ValueError, IndexError) as e:
    raise ImportProblem(f'{directory}: the weights do not fit config.json ({e})') from None
  _check_shapes(directory, cfg, params)
  _check_finite(directory, params)
  return Imported(arch.name, fields, params, tokenizer)


def _check_finite(directory: str, params) -> None:
  """Every weight finite: a NaN decodes to empty lines with exit 0, an inf to '!!!!'."""
  for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
    bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
    if bad:
      name = '/'.join(str(getattr(k, 'key', k)) for k in path)
      raise ImportProblem(f'{directory}: {name} has {bad} non-finite value(s) (NaN or inf); '
                          'nothing was written')


# Buffers some transformers versions saved and others do not (GPT-2's causal mask, BERT's
# position ids): not weights, never read.
_BUFFERS = ('.attn.bias', '.attn.masked_bias', 'position_ids', 'token_type_ids')


def _check_against_config(directory: str, hf: dict, arch, sd: dict) -> None:
  """Every tensor of the checkpoint is one the model config.json describes, with the shape
  config.json implies (transformers' own model, built on the meta device: nothing is
  allocated): a tensor left over (n_layer=1 over two layers' weights) or of another shape
  (n_positions=16 over 64 rows, one element more in a bias) is refused before any slicing."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  cls = getattr(transformers, arch.name)
  try:
    config = cls.config_class.from_dict(dict(hf))
    with torch.device('meta'):
      expected = {k.removeprefix(arch.prefix): tuple(v.shape)
                  for k, v in cls(config).state_dict().items()}
  except Exception as e:  # noqa: BLE001  (transformers' own refusal of a value)
    raise ImportProblem(f'{directory}/config.json describes no {arch.name}: {type(e).__name__}: '
                        f'{" ".join(str(e).split())[:200]}') from None
  for name in sorted(sd):
    shape = tuple(np.shape(sd[name]))
    if name not in expected:
      if not name.endswith(_BUFFERS):
        raise ImportProblem(f'{directory}: the checkpoint has {name} {shape}, which the model '
                            'of its config.json does not (more layers than n_layer?)')
    elif shape != expected[name]:
      raise ImportProblem(f'{directory}: {name} has shape {shape} in the checkpoint but '
                          f'config.json makes it {expected[name]}')


def _check_shapes(directory: str, cfg, params) -> None:
  """Every parameter of the model of `cfg`, with its shape (else one line naming the first)."""
  from model import build  # pylint: disable=import-outside-toplevel
  want = build.param_shapes(cfg)
  flat_want = dict(jax.tree_util.tree_flatten_with_path(want)[0])
  flat_got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  for path, shape in flat_want.items():
    got = flat_got.get(path)
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    if got is None:
      raise ImportProblem(f'{directory}: no weight for {name}')
    if tuple(np.shape(got)) != tuple(getattr(shape, 'shape', shape)):
      raise ImportProblem(f'{directory}: {name} has shape {tuple(np.shape(got))} in the '
                          f'checkpoint but config.json makes it {tuple(shape.shape)}')


def refuse_existing(workdir: str) -> None:
  if os.path.lexists(workdir):
    raise ImportProblem(f'--workdir={workdir} exists; give a new directory (nothing was written)')


STAGING = '.importing-'  # a staging directory: `.NAME.importing-RANDOM` beside NAME


def write_workdir(imported: Imported, workdir: str) -> None:
  """The workdir of `imported` at `workdir` (which must not exist), complete or not at all.

  It is written in a private directory beside `workdir` (a fresh random name: nothing that was
  there before is touched) and renamed into place under a lock on the parent directory, so two
  imports into one `workdir` cannot mix their files: the second is refused. A killed import
  (SIGKILL) may leave its `.NAME.importing-*` directory behind; nothing else."""
  from configs import base  # pylint: disable=import-outside-toplevel
  from model import ModelConfig  # pylint: disable=import-outside-toplevel
  from training import checkpoint, config_io, mesh, optim, state  # pylint: disable=import-outside-toplevel
  refuse_existing(workdir)
  config = base.base_config()
  config.model.update(imported.model)
  config.data.tokenizer = imported.tokenizer.name
  config.data.vocab_size = imported.tokenizer.vocab_size
  target = os.path.abspath(workdir.rstrip(os.sep) or os.sep)
  parent, name = os.path.dirname(target), os.path.basename(target)
  try:
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=f'.{name}{STAGING}', dir=parent)
  except OSError as e:
    raise ImportProblem(f'--workdir={workdir}: cannot write there: {_why(e)} (nothing was '
                        'written)') from None
  try:
    config_io.save_config(config, partial)
    imported.tokenizer.save(os.path.join(partial, tokenizers.TOKENIZER_DIR))
    cfg = ModelConfig.from_config(config.model)
    tx = optim.make_optimizer(config, optim.make_schedule(config))
    params = jax.tree.map(np.asarray, imported.params)
    train_state = state.create_train_state(cfg, tx, config.train.seed, mesh.make_mesh(1),
                                           params=params)
    saver = checkpoint.Checkpointer(partial, async_save=False)
    saver.save(0, train_state, None)
    saver.close()
    with _locked(parent):  # the check and the rename, atomic among imports
      refuse_existing(workdir)
      os.rename(partial, target)
  except OSError as e:
    shutil.rmtree(partial, ignore_errors=True)
    raise ImportProblem(f'--workdir={workdir}: cannot write there: {_why(e)} (nothing was '
                        'written)') from None
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise


def _why(error: OSError) -> str:
  return 'no space left on device' if error.errno == errno.ENOSPC else (
      error.strerror or str(error))


@contextlib.contextmanager
def _locked(directory: str):
  """An exclusive flock on `directory` itself (no lock file is left behind)."""
  fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)
