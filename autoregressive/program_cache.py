"""Decoding programs kept on disk as `jax.export` artifacts, so a new process skips tracing.

A decode.py run compiles one search program per batch shape. JAX's persistent compilation
cache already skips XLA's compilation on a second run, but every program is still traced
(the whole model, inside every loop of the search) and lowered first: ~0.4 s per shape, about
half of a cold run's time. `enable(directory)` (decode.py's `--compilation_cache`) makes
`call` store each program, exported, under `directory` and load it in later processes; off,
`call` is the plain jitted call. Same program, so the same tokens (tested); XLA may lay out
an exported program's arrays otherwise, so beam scores may differ in float rounding.

Beside each exported program its compiled executable is kept (`jax.experimental.
serialize_executable`): loading it skips lowering the exported program and looking it up in
JAX's cache (~0.2-0.3 s per program on a 2-core CPU). XLA checks that an executable suits
the machine it is loaded on; one that does not load (another CPU, a damaged file) is compiled
again from the exported program, and written again.

The key of a program covers everything it was built from: JAX's version and backend, the
source of the model and search packages, the module (its config), the static arguments and
the arguments' shapes and dtypes. Only single-device processes use it (an exported program
fixes its shardings). A file that cannot be read is exported again; failing to write one
only costs the next run the tracing.
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

_PACKAGES = ('autoregressive', 'model')  # whose code the programs are traced from
_state: dict[str, Any] = {'directory': None}
_loaded: dict[tuple, Callable] = {}  # call's signature -> the exported program, jitted


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
  if program is None:
    if any(isinstance(x, jax.core.Tracer) for x in leaves):  # inside the caller's own jit
      return fn(module, *args, **static)
    path = os.path.join(directory, _key(signature))
    try:
      exported = _load_or_export(f'{path}.jaxexport', fn, module, args, static)
    except Exception:  # noqa: BLE001  # what jax.export cannot express runs as it is
      program = functools.partial(fn, module, **static)
    else:
      program = _executable(f'{path}.xla', exported, args)
    _loaded[signature] = program
  return program(*args)


def _aval(x) -> tuple:
  """(shape, dtype, weak type) of an argument, arrays' own first (a batch's call builds this
  for every parameter: with `jnp.result_type` and dtype names it took ~2 ms)."""
  if isinstance(x, (jax.Array, np.ndarray)):
    return x.shape, x.dtype, getattr(x, 'weak_type', False)
  return jax.numpy.shape(x), jax.numpy.result_type(x), getattr(x, 'weak_type', False)


def _load_or_export(path, fn, module, args, static):
  """The `jax.export.Exported` program at `path`, exported (and written) when unreadable."""
  from jax import export  # pylint: disable=import-outside-toplevel
  try:
    with open(path, 'rb') as f:
      return export.deserialize(bytearray(f.read()))
  except Exception:  # noqa: BLE001, S110  # missing or unreadable: exported again below
    pass
  exported = export.export(fn)(module, *args, **static)
  _write(path, exported.serialize())
  return exported


def _executable(path, exported, args) -> Callable:
  """`exported`'s program for `args`, compiled: loaded from `path`, else compiled (through
  JAX's cache) and written there; the jitted exported call where executables cannot be
  serialized."""
  from jax.experimental import serialize_executable as serial  # pylint: disable=import-outside-toplevel
  in_tree = jax.tree.structure((args, {}))
  try:
    with open(path, 'rb') as f:
      return serial.deserialize_and_load(f.read(), in_tree, exported.out_tree)
  except Exception:  # noqa: BLE001, S110  # missing, damaged or for another machine
    pass
  compiled = _compile(exported, args)
  try:
    payload, _, _ = serial.serialize(compiled)
  except Exception:  # noqa: BLE001  # a backend without serializable executables
    return jax.jit(exported.call)
  _write(path, payload)
  return compiled


def _compile(exported, args):
  return jax.jit(exported.call).lower(*args).compile()


def _write(path, data: bytes) -> None:
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, data)
  except Exception:  # noqa: BLE001, S110  # a cache is only an optimisation
    pass


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
