"""Deprecated: moved to `autoregressive.beam_search`
(the search over the KV cache); this module is now that one."""

import importlib
import sys
import warnings

warnings.warn('model.beam_search moved to autoregressive.beam_search', DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = importlib.import_module('autoregressive.beam_search')
