"""Deprecated: moved to `autoregressive.scoring` (the search runs below `training`, whose
validation BLEU uses it); this module is now that one."""

import importlib
import sys
import warnings

warnings.warn('inference.scoring moved to autoregressive.scoring', DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = importlib.import_module('autoregressive.scoring')
