"""Reading a `transformers` checkpoint directory: its config.json, its weights (safetensors,
one file or sharded, or a torch `pytorch_model.bin`) and its tokenizer files. Every problem is
an `ImportProblem` (one line naming the file)."""

from __future__ import annotations

import json
import os
import re

import numpy as np

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


def read_json(directory: str, name: str, required: bool = True) -> dict:
  path = os.path.join(directory, name)
  if not os.path.isfile(path):
    if required:
      raise ImportProblem(f'{directory} is not a transformers checkpoint: {name} not found')
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      found = json.load(f)
  except (OSError, ValueError) as e:
    raise ImportProblem(f'cannot read {path}: {type(e).__name__}: {e}') from None
  if not isinstance(found, dict):
    raise ImportProblem(f'{path} is not a JSON object')
  return found


def read_bytes(directory: str, name: str, what: str) -> bytes:
  path = os.path.join(directory, name)
  try:
    with open(path, 'rb') as f:
      return f.read()
  except FileNotFoundError:
    raise ImportProblem(f'{directory} has no {name} ({what})') from None
  except OSError as e:
    raise ImportProblem(f'cannot read {path}: {e.strerror or e}') from None


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
  found = [name for name in WEIGHTS if os.path.isfile(os.path.join(directory, name))]
  if not found:
    raise ImportProblem(f'{directory} is not a transformers checkpoint: none of '
                        f'{", ".join(WEIGHTS)} found')
  name = found[0]
  path = os.path.join(directory, name)
  try:
    if name == 'model.safetensors.index.json':
      shards = sorted(set(read_json(directory, name).get('weight_map', {}).values()))
      weights = {}
      for shard in shards:
        weights.update(_safetensors(os.path.join(directory, shard)))
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

