"""The Transformer: pure attention functions (`model.attention`) and the Flax NNX modules.

Inside the package each module imports only those below it (and `common`):
  masks, dropout, kv_cache -> chunked_attention -> attention -> partitioning -> layers -> stacks
  -> transformer (the NNX modules) -> kinds (one adapter per model kind) -> config -> build
"""

from model.build import abstract_model, bind, build_model, params_of
from model.config import ConfigError, ModelConfig
from model.kinds import ADAPTERS
from model.transformer import DecoderOnly, EncoderDecoder, EncoderOnly, shift_right

__all__ = ['ADAPTERS', 'ConfigError', 'ModelConfig', 'EncoderDecoder', 'DecoderOnly',
           'EncoderOnly', 'abstract_model', 'bind', 'build_model', 'params_of', 'shift_right']
