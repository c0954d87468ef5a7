"""Decoding programs kept on disk as `jax.export` artifacts, so a new process skips tracing.

A decode.py run compiles one search program per batch shape. JAX's persistent compilation
cache already skips XLA's compilation on a second run, but every program is still traced
(the whole model, inside every loop of the search) and lowered first: ~0.4 s per shape, about
half of a cold run's time. `enable(directory)` (decode.py's `--compilation_cache`) makes
`call` store each program, exported, under `directory` and load it in later processes; off,
`call` is the plain jitted call. Same program, so the same tokens (tested); XLA may lay out
an exported program's arrays otherwise, so beam scores may differ in float rounding.

The key of a program covers everything it was built from: JAX's version and backend, the
source of the model and search packages, the module (its config), the static arguments and
the arguments' shapes and dtypes. Only single-device processes use it (an exported program
fixes its shardings). A file that cannot be read, fails its sha256, or cannot be parsed or
called with the arguments (missing, damaged, or another program's) is a miss: the program is
exported again and replaces it; failing to write one only costs the next run the tracing.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from common.atomic_file import atomic_write
from common.files import read_regular

_PACKAGES = ('autoregressive', 'model')  # whose code the programs are traced from
_state: dict[str, Any] = {'directory': None}
_loaded: dict[tuple, Callable] = {}  # call's signature -> the exported program, jitted
_DIGEST = 32  # a file is the sha256 of the serialized program, then the program


def enable(directory: str | None) -> None:
  """Keeps exported programs under `directory` (None: off)."""
  _state['directory'] = None if not directory else os.path.expanduser(directory)


def call(fn, module, *args, **static):
  """`fn(module, *args, **static)`: `fn` a `jax.jit` function whose static arguments are
  `module` and `static`, run through its exported program when enabled."""
  directory = _state['directory']
  if directory is None or jax.device_count() != 1:
    return fn(module, *args, **static)
  leaves, tree = jax.tree.flatten(args)
  signature = (fn, module, tuple(sorted(static.items())), tree, tuple(map(_aval, leaves)))
  program = _loaded.get(signature)  # the same search again in this process: no hashing
  if program is not None:
    return program(*args)
  path = os.path.join(directory, f'{_key(signature)}.jaxexport')
  loaded = _load(path)
  if loaded is not None:
    try:  # a file is parsed and checked against the arguments at its first call
      result = loaded(*args)
      _loaded[signature] = loaded
      return result
    except Exception:  # noqa: BLE001, S110  # damaged, or another program's: a miss
      pass
  try:
    program = jax.jit(_export(path, fn, module, args, static))
  except Exception:  # noqa: BLE001  # what jax.export cannot express runs as it is
    program = functools.partial(fn, module, **static)
  _loaded[signature] = program
  return program(*args)


def _aval(x) -> tuple:
  """(shape, dtype, weak type) of an argument, arrays' own first (a batch's call builds this
  for every parameter: with `jnp.result_type` and dtype names it took ~2 ms)."""
  if isinstance(x, (jax.Array, np.ndarray)):
    return x.shape, x.dtype, getattr(x, 'weak_type', False)
  return jax.numpy.shape(x), jax.numpy.result_type(x), getattr(x, 'weak_type', False)


def _load(path: str) -> Callable | None:
  """The program stored at `path`, jitted, or None when it is missing, cannot be read or
  fails its digest (a flipped bit may still parse, and compute something else)."""
  from jax import export  # pylint: disable=import-outside-toplevel
  try:
    data = read_regular(path)  # a FIFO planted in the cache must not block
    digest, payload = data[:_DIGEST], data[_DIGEST:]
    if hashlib.sha256(payload).digest() != digest:
      return None
    return jax.jit(export.deserialize(bytearray(payload)).call)
  except Exception:  # noqa: BLE001  # missing or unreadable: exported again
    return None


def _export(path: str, fn, module, args, static) -> Callable:
  """`fn` exported for these arguments, written to `path` (replacing whatever was there)."""
  from jax import export  # pylint: disable=import-outside-toplevel
  exported = export.export(fn)(module, *args, **static)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = bytes(exported.serialize())
    atomic_write(path, hashlib.sha256(payload).digest() + payload)
  except Exception:  # noqa: BLE001, S110  # a cache is only an optimisation
    pass
  return exported.call


def _key(signature) -> str:
  """The file name of a program: `call`'s signature, with what the process runs on."""
  fn, module, static, tree, shapes = signature
  parts = [jax.__version__, jax.default_backend(), jax.devices()[0].device_kind, _source_hash(),
           getattr(fn, '__qualname__', repr(fn)), repr(module), repr(static), str(tree),
           repr(shapes)]
  return hashlib.sha256('\n'.join(parts).encode()).hexdigest()[:32]


@functools.cache
def _source_hash() -> str:
  """A digest of every .py file of `_PACKAGES`: a program traced from other code is another."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for package in _PACKAGES:
    for folder, _, names in sorted(os.walk(os.path.join(root, package))):
      for name in sorted(n for n in names if n.endswith('.py')):
        with open(os.path.join(folder, name), 'rb') as f:
          digest.update(name.encode() + b'\0' + f.read())
  return digest.hexdigest()
