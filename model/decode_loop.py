"""Deprecated: moved to `inference.decode_loop`;
everything after training lives in `inference/`. This module is now that one."""

import importlib
import sys
import warnings

warnings.warn('model.decode_loop moved to inference.decode_loop', DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module('inference.decode_loop')
