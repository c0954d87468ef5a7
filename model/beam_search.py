"""Deprecated: moved to `inference.beam_search`;
everything after training lives in `inference/`. This module is now that one."""

import importlib
import sys
import warnings

warnings.warn('model.beam_search moved to inference.beam_search', DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module('inference.beam_search')
