"""Directories built once per test run and shared by every test and xdist worker (read-only:
copy before modifying). No JAX here: conftest.py imports this before its settings."""

import fcntl
import json
import os
import shutil


def built_once(tmp_path_factory, name: str, build) -> dict:
  """`build(directory) -> dict` (JSON) run once per test run, whichever xdist worker asks first;
  the others wait for it and get the same result. Tests must not modify what it made (copy
  first). A build that fails is retried by the next caller, and fails there too."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent  # the run's directory, above each worker's own
  directory, result = root / name, root / f'{name}.json'
  with open(root / f'{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not result.exists():
      shutil.rmtree(directory, ignore_errors=True)
      directory.mkdir()
      with open(result.with_suffix('.tmp'), 'w') as f:
        json.dump(build(directory), f)
      os.replace(result.with_suffix('.tmp'), result)
    with open(result) as f:
      return json.load(f)


def tree_digest(root) -> dict:
  """{relative path: 'dir', 'link:TARGET' (never followed) or the sha256 of the file} of
  everything under `root`: equal before and after shows that nothing in it was touched."""
  import hashlib  # pylint: disable=import-outside-toplevel
  out = {}
  for base, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(base, name)
      rel = os.path.relpath(path, root)
      if os.path.islink(path):
        out[rel] = 'link:' + os.readlink(path)
      elif os.path.isdir(path):
        out[rel] = 'dir'
      else:
        with open(path, 'rb') as f:
          out[rel] = hashlib.sha256(f.read()).hexdigest()
  return out
