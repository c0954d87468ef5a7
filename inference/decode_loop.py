"""Deprecated: moved to `autoregressive.decode_loop` (the search runs below `training`, whose
validation BLEU uses it); this module is now that one."""

import importlib
import sys
import warnings

warnings.warn('inference.decode_loop moved to autoregressive.decode_loop', DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = importlib.import_module('autoregressive.decode_loop')
