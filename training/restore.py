"""Deprecated: moved to `inference.restore` (restoring a workdir for inference is part of the
inference package); this module is now that one."""

import importlib
import sys
import warnings

warnings.warn('training.restore moved to inference.restore', DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module('inference.restore')
