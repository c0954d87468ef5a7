"""Decoding programs kept on disk as `jax.export` artifacts, so a new process skips tracing.

A decode.py run compiles one search program per batch shape. JAX's persistent compilation
cache already skips XLA's compilation on a second run, but every program is still traced
(the whole model, inside every loop of the search) and lowered first: ~0.4 s per shape, about
half of a cold run's time. `enable(directory)` (decode.py's `--compilation_cache`) makes
`call` store each program, exported, under `directory` and load it in later processes; off,
`call` is the plain jitted call. Same program, so the same tokens (tested); XLA may lay out
an exported program's arrays otherwise, so beam scores may differ in float rounding.

The key of a program covers everything it was built from: JAX's version and backend, the
source of the model and search packages, the model's config, the static arguments and the
arguments' structure, shapes and dtypes. The exported program takes the arguments' leaves (the
parameters' pure dict has int keys, `layers/0`, which `jax.export` cannot serialize in a tree);
the structure is part of the key. Only single-device processes use it (an exported program
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


def enable_compilation_cache(directory: str | None) -> str | None:
  """JAX's persistent compilation cache in `directory` (None or '': off), so that a second run
  with the same shapes skips compiling, and the exported programs beside it (`enable`), so that
  it skips tracing them too. Returns why it could not (a cache is only an optimisation), or
  None."""
  if not directory:
    return None
  try:
    path = os.path.expanduser(directory)
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
    enable(os.path.join(path, 'programs'))
  except Exception as e:  # noqa: BLE001  # any failure leaves decoding as it is, uncached
    return str(e)
  return None


def call(fn, config, *args, **static):
  """`fn(config, *args, **static)`: `fn` a `jax.jit` function whose static arguments are
  `config` (a `ModelConfig`) and `static`, run through its exported program when enabled."""
  directory = _state['directory']
  if directory is None or jax.device_count() != 1:
    return fn(config, *args, **static)
  leaves, tree = jax.tree.flatten(args)
  signature = (fn, config, tuple(sorted(static.items())), tree, tuple(map(_aval, leaves)))
  program = _loaded.get(signature)  # the same search again in this process: no hashing
  if program is not None:
    return program(leaves)
  path = os.path.join(directory, f'{_key(signature)}.jaxexport')
  loaded = _load(path)
  if loaded is not None:
    try:  # a file is parsed and checked against the arguments at its first call
      result = loaded(leaves)
      _loaded[signature] = loaded
      return result
    except Exception:  # noqa: BLE001, S110  # damaged, or another program's: a miss
      pass
  on_leaves = functools.partial(_on_leaves, fn, config, tree, static)
  try:
    program = jax.jit(_export(path, on_leaves, leaves))
  except Exception:  # noqa: BLE001  # what jax.export cannot express runs as it is
    program = on_leaves
  _loaded[signature] = program
  return program(leaves)


def _on_leaves(fn, config, tree, static, leaves):
  """`fn` on the arguments whose leaves are `leaves` (a list: what the program takes)."""
  return fn(config, *jax.tree.unflatten(tree, leaves), **static)


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


def _export(path: str, on_leaves, leaves) -> Callable:
  """`on_leaves` exported for these argument leaves, written to `path` (replacing whatever
  was there)."""
  from jax import export  # pylint: disable=import-outside-toplevel
  exported = export.export(jax.jit(on_leaves))(leaves)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = bytes(exported.serialize())
    atomic_write(path, hashlib.sha256(payload).digest() + payload)
  except Exception:  # noqa: BLE001, S110  # a cache is only an optimisation
    pass
  return exported.call


def _key(signature) -> str:
  """The file name of a program: `call`'s signature, with what the process runs on."""
  fn, config, static, tree, shapes = signature
  parts = [jax.__version__, jax.default_backend(), jax.devices()[0].device_kind, _source_hash(),
           getattr(fn, '__qualname__', repr(fn)), repr(config), repr(static), str(tree),
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
