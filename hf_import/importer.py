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

from common.errors import ConfigError, carried
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
  decode: dict = dataclasses.field(default_factory=dict)  # `config.decode` fields


def _marian_tokenizer(directory: str, hf: dict):
  settings = checkpoint_dir.read_json(directory, 'tokenizer_config.json', required=False)
  if settings.get('separate_vocabs'):
    raise ImportProblem(f'{directory}: separate_vocabs=True (a target_vocab.json of its own) '
                        'cannot be imported: one vocabulary serves source and target here')
  files = {name: checkpoint_dir.read_bytes(directory, name, 'a MarianTokenizer file')
           for name in pretrained.FILES['marian']}
  vocab = checkpoint_dir.read_json(directory, 'vocab.json')
  for piece, i in vocab.items():  # each id names an embedding row of the model
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < hf['vocab_size']:
      raise ImportProblem(f'{directory}/vocab.json gives {piece!r} the id {i!r}, but the '
                          f'model has ids 0 to {hf["vocab_size"] - 1} (config.json vocab_size)')
  specials = {key: str(settings.get(f'{key}_token', default)) for key, default in
              (('eos', '</s>'), ('unk', '<unk>'), ('pad', '<pad>'))}
  missing = [token for token in specials.values() if token not in vocab]
  if missing:
    raise ImportProblem(f'{directory}/vocab.json has no {missing[0]!r} token')
  order = vocab_order(hf['vocab_size'], hf['pad_token_id'], hf['eos_token_id'],
                      vocab[specials['unk']])
  try:
    return pretrained.MarianTokenizer(files['source.spm'], files['target.spm'], vocab, order,
                                      specials)
  except RuntimeError as e:  # sentencepiece's refusal of a file that is not one of its models
    raise ImportProblem(f'{directory}: source.spm or target.spm is not a sentencepiece model '
                        f'({" ".join(str(e).split())[:120]})') from None


def _huggingface_tokenizer(directory: str, hf: dict, arch):
  data = checkpoint_dir.read_bytes(directory, 'tokenizer.json', 'the fast tokenizer file '
                                   '(save the tokenizer with transformers to write it)')
  _check_tokenizer_json(directory, data, hf['vocab_size'], arch)
  start, eos = arch.specials(hf)
  order = vocab_order(hf['vocab_size'], start, eos, None)
  try:
    return pretrained.HuggingFaceTokenizer(data, order, eos)
  except Exception as e:  # pylint: disable=broad-except
    raise ImportProblem(f'cannot read {directory}/tokenizer.json: {e}') from None


def _check_tokenizer_json(directory: str, data: bytes, vocab_size: int, arch) -> None:
  """The tokenizer is the model's kind (GPT-2's byte-level BPE, BERT's WordPiece) and every id
  it can give is a row of the model's embedding: another model's tokenizer is refused here,
  not met as an IndexError when decoding."""
  import json  # pylint: disable=import-outside-toplevel
  try:
    spec = json.loads(data)
    model = spec['model']
    ids = list((model.get('vocab') or {}).values()) if isinstance(model.get('vocab'), dict) else []
    ids += [t['id'] for t in spec.get('added_tokens') or []]
    kind = model.get('type')
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ImportProblem(f'cannot read {directory}/tokenizer.json: {type(e).__name__}: '
                        f'{" ".join(str(e).split())[:120]}') from None
  if arch.tokenizer_model and kind != arch.tokenizer_model:
    raise ImportProblem(f'{directory}/tokenizer.json is a {kind} tokenizer, but '
                        f'{arch.name} comes with a {arch.tokenizer_model} one (another '
                        "model's tokenizer?)")
  bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool)
         or not 0 <= i < vocab_size]
  if bad:
    raise ImportProblem(f'{directory}/tokenizer.json has the id {bad[0]!r}, but the model has '
                        f'ids 0 to {vocab_size - 1} (config.json vocab_size)')


def load(directory: str) -> Imported:
  """Reads and converts the checkpoint in `directory`; raises ImportProblem or
  architectures.Unsupported (one line each)."""
  hf = checkpoint_dir.read_json(directory, 'config.json')
  arch = architectures.architecture(hf)
  architectures.token_ids(hf, arch)
  sd = checkpoint_dir.state_dict(directory)
  if arch.prefix:
    sd = {k.removeprefix(arch.prefix): v for k, v in sd.items()}
  _check_against_config(directory, hf, arch, sd)
  try:
    fields = arch.model(hf, sd)
  except KeyError as e:
    raise ImportProblem(f'{directory}/config.json has no {e.args[0]!r}') from None
  tokenizer = (_marian_tokenizer(directory, hf) if arch.tokenizer == 'marian' else
               _huggingface_tokenizer(directory, hf, arch))
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
  return Imported(arch.name, fields, params, tokenizer, _decode_settings(directory, fields))


def _decode_settings(directory: str, fields: dict) -> dict:
  """generation_config.json's settings as `config.decode` fields (none without the file),
  checked as config.decode is."""
  if fields['kind'] == 'encoder_only':  # BertModel generates nothing
    return {}
  generation = checkpoint_dir.read_json(directory, 'generation_config.json', required=False)
  decode = architectures.decode_settings(generation, fields['kind'], fields['max_len'])
  from configs.schema import DecodeConfig  # pylint: disable=import-outside-toplevel
  try:
    DecodeConfig.from_config(decode)
  except ConfigError as e:
    raise ImportProblem(f'{directory}/generation_config.json: {e}') from None
  return decode


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
  from workdir import checkpoint, config_io  # pylint: disable=import-outside-toplevel
  refuse_existing(workdir)
  config = base.base_config()
  config.model.update(imported.model)
  config.decode.update(imported.decode)
  # Decoding stops at max_len tokens whatever the bound says: written as it acts (and as an
  # export writes it, so that a round trip keeps it).
  config.decode.max_new_tokens = min(config.decode.max_new_tokens, imported.model['max_len'])
  config.data.tokenizer = imported.tokenizer.name
  config.data.vocab_size = imported.tokenizer.vocab_size
  target = os.path.abspath(workdir.rstrip(os.sep) or os.sep)
  parent, name = os.path.dirname(target), os.path.basename(target)
  try:
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=f'.{name}{STAGING}', dir=parent)
  except OSError as e:
    blocker = _file_in_the_way(parent)
    why = f'{blocker} is a file, not a directory' if blocker else _why(e)
    raise carried(ImportProblem(f'--workdir={workdir}: cannot write there: {why} (nothing '
                                'was written)'), e) from None
  try:
    config_io.save_config(config, partial)
    imported.tokenizer.save(os.path.join(partial, tokenizers.TOKENIZER_DIR))
    checkpoint.save_params(partial, jax.tree.map(np.asarray, imported.params))
    with _locked(parent):  # the check and the rename, atomic among imports
      refuse_existing(workdir)
      os.rename(partial, target)
  except OSError as e:
    shutil.rmtree(partial, ignore_errors=True)
    raise carried(ImportProblem(f'--workdir={workdir}: cannot write there: {_why(e)} (nothing '
                                'was written)'), e) from None
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise


def _file_in_the_way(path: str) -> str | None:
  """The nearest existing ancestor of `path` (itself included) if it is not a directory."""
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return None if os.path.isdir(path) else path


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
