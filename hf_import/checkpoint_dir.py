"""Reading a `transformers` checkpoint directory: its config.json, its weights (safetensors,
one file or sharded, or a torch `pytorch_model.bin`) and its tokenizer files. Every problem is
an `ImportProblem` (one line naming the file)."""

from __future__ import annotations

import json
import os
import re

import numpy as np

from common.files import NotARegularFileError, open_regular, read_regular

WEIGHTS = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin')
# A Hub id (`--from=Helsinki-NLP/opus-mt-en-de`): owner/name, no path of this machine.
_HUB_ID = re.compile(r'^[A-Za-z0-9][\w.-]*/[\w.-]+$')


class ImportProblem(ValueError):
  """The checkpoint cannot be imported; the message names what and where."""


def resolve(path: str) -> str:
  """A local checkpoint directory, or a Hub id downloaded (when the Hub is reachable)."""
  if os.path.exists(path) or not _HUB_ID.match(path):
    if not os.path.isdir(path):
      raise ImportProblem(f'{path} is not a directory (a transformers checkpoint directory, or '
                          'a Hub id such as Helsinki-NLP/opus-mt-en-de)')
    return path
  try:
    from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel
    return snapshot_download(path, allow_patterns=['*.json', '*.spm', '*.txt', '*.safetensors',
                                                   '*.bin'])
  except Exception as e:  # pylint: disable=broad-except  (offline, unknown id, ...)
    raise ImportProblem(f'cannot download {path} from the Hugging Face Hub: '
                        f'{" ".join(str(e).split())[:200]}') from None


def _inside(directory: str, name: str) -> str:
  """DIRECTORY/NAME, refused unless the name stays inside the checkpoint directory (an
  absolute or `..` shard path in an index would read another file). Symlinks are followed:
  the Hub's cache links each file to its blob; what they reach must be a regular file.
  """
  normal = os.path.normpath(name)
  if os.path.isabs(name) or normal == os.pardir or normal.startswith(os.pardir + os.sep):
    raise ImportProblem(f'{directory}: {name!r} is outside the checkpoint directory')
  return os.path.join(directory, normal)


def _read(path: str) -> bytes:
  """A regular file's bytes (`common.files.read_regular`: a FIFO would block forever, a
  symlink to /dev/zero read until memory runs out)."""
  try:
    return read_regular(path)
  except NotARegularFileError as e:
    raise ImportProblem(str(e)) from None


def read_json(directory: str, name: str, required: bool = True) -> dict:
  path = _inside(directory, name)
  if not os.path.lexists(path):
    if required:
      raise ImportProblem(f'{directory} is not a transformers checkpoint: {name} not found')
    return {}
  try:
    found = json.loads(_read(path))
  except (OSError, ValueError) as e:
    raise ImportProblem(f'cannot read {path}: {type(e).__name__}: {e}') from None
  if not isinstance(found, dict):
    raise ImportProblem(f'{path} is not a JSON object')
  return found


def read_bytes(directory: str, name: str, what: str) -> bytes:
  path = _inside(directory, name)
  try:
    return _read(path)
  except FileNotFoundError:
    raise ImportProblem(f'{directory} has no {name} ({what})') from None
  except OSError as e:
    raise ImportProblem(f'cannot read {path}: {e.strerror or e}') from None


def _regular(directory: str, name: str) -> str:
  """DIRECTORY/NAME if it is a regular file inside the directory (a weights file is read by
  safetensors or torch, not by `_read`: checked first)."""
  path = _inside(directory, name)
  try:
    open_regular(path).close()
  except NotARegularFileError as e:
    raise ImportProblem(str(e)) from None
  except OSError as e:
    raise ImportProblem(f'cannot read {path}: {e.strerror or e}') from None
  return path


def _safetensors(path: str) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  try:
    return load_file(path)
  except Exception:  # pylint: disable=broad-except  (bfloat16 weights: NumPy has no dtype)
    from safetensors.torch import load_file as load_torch  # pylint: disable=import-outside-toplevel
    return {k: v.float().numpy() for k, v in load_torch(path).items()}


def _torch_bin(path: str) -> dict[str, np.ndarray]:
  import torch  # pylint: disable=import-outside-toplevel
  return {k: v.float().numpy() for k, v in
          torch.load(path, map_location='cpu', weights_only=True).items()}


def state_dict(directory: str) -> dict[str, np.ndarray]:
  """name -> float32 array of every weight the directory holds."""
  found = [name for name in WEIGHTS if os.path.lexists(os.path.join(directory, name))]
  if not found:
    raise ImportProblem(f'{directory} is not a transformers checkpoint: none of '
                        f'{", ".join(WEIGHTS)} found')
  name = found[0]
  path = _regular(directory, name)
  try:
    if name == 'model.safetensors.index.json':
      shards = read_json(directory, name).get('weight_map', {})
      if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
        raise ImportProblem(f'{path}: weight_map is not an object of file names')
      weights = {}
      for shard in sorted(set(shards.values())):
        weights.update(_safetensors(_regular(directory, shard)))
    elif name.endswith('.safetensors'):
      weights = _safetensors(path)
    else:
      weights = _torch_bin(path)
  except ImportProblem:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise ImportProblem(f'cannot read the weights {path}: {type(e).__name__}: '
                        f'{" ".join(str(e).split())[:200]}') from None
  return {k: np.asarray(v, np.float32) for k, v in weights.items()}

