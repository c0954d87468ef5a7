"""tensorboardX, imported without torch.

tensorboardX's writer module runs `import torch` whenever torch is installed (the `hf` extra
installs it), only to accept torch tensors; the scalars written here are floats. That import
is ~1 s of every train.py start (and report.py's), more than the rest of tensorboardX.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def tensorboardx() -> ModuleType:
  """The `tensorboardX` package (imported once; torch stays unimported unless it already is)."""
  if 'tensorboardX' in sys.modules or 'torch' in sys.modules:
    return importlib.import_module('tensorboardX')
  sys.modules['torch'] = None  # `import torch` raises ImportError: tensorboardX goes without
  try:
    return importlib.import_module('tensorboardX')
  finally:
    del sys.modules['torch']
