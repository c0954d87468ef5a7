"""Deprecated: moved to `autoregressive.decoding` (the search runs below `training`, whose
validation BLEU uses it); this module is now that one."""

import importlib
import sys
import warnings

warnings.warn('inference.decoding moved to autoregressive.decoding', DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = importlib.import_module('autoregressive.decoding')
