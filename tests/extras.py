"""The `[test]` extra's optional packages (torch, transformers, ctranslate2, tensorboard),
imported, never skipped: a shipped feature's tests that skipped when their package was missing
or broken passed silently on a broken install (issue 62). Now the run fails, naming the
package and the install command."""

import importlib

import pytest


def require(name: str):
  """The module `name`, or a failure of the test (or of the collection) that names it."""
  try:
    return importlib.import_module(name)
  except Exception as e:  # noqa: BLE001  (ImportError, or a broken install's own error)
    pytest.fail(f"{name} cannot be imported ({type(e).__name__}: {e}); the [test] extra "
                "installs it: pip install -e '.[test]'", pytrace=False)
