"""The suite, grouped by the room it tests: tests/model/, tests/decoding/ (autoregressive/),
tests/training/, ... ; tests/commands/ holds the command lines' end-to-end tests and
tests/project/ the repository's own rules (layering, documented paths, the guide's snippets).
What every room shares sits here: conftest.py's fixtures (the tiny train.py workdirs, the
suite's JAX settings) and the helper modules (`from tests import shared_dirs, mains, ...`)."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
