"""Deprecated: moved to `inference.plotting`;
everything after training lives in `inference/`. This module is now that one."""

import importlib
import sys
import warnings

warnings.warn('model.plotting moved to inference.plotting', DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module('inference.plotting')
