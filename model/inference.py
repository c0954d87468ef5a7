"""Deprecated: moved to `inference.translator`;
everything after training lives in `inference/`. This module is now that one."""

import importlib
import sys
import warnings

warnings.warn('model.inference moved to inference.translator', DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module('inference.translator')
