"""Deprecated: moved to `autoregressive.translator`
(the search over the KV cache); this module is now that one."""

import importlib
import sys
import warnings

warnings.warn('model.inference moved to autoregressive.translator', DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = importlib.import_module('autoregressive.translator')
