"""The Transformer: pure attention functions (`model.attention`) and the Linen modules.

Inside the package each module imports only those below it (and `common`):
  masks, dropout -> chunked_attention -> attention -> partitioning, layers
  -> transformer (the Linen modules) -> kinds (one adapter per model kind) -> config
"""

from model.config import ConfigError, ModelConfig
from model.kinds import ADAPTERS
from model.transformer import DecoderOnly, EncoderDecoder, EncoderOnly, shift_right

__all__ = ['ConfigError', 'ModelConfig', 'EncoderDecoder', 'DecoderOnly', 'EncoderOnly',
           'build_model', 'shift_right']


def build_model(model_config):
  """The `flax.linen.Module` for `model_config.kind` (a ConfigDict, dict or `ModelConfig`),
  validated (`ConfigError` names a bad field)."""
  if not isinstance(model_config, ModelConfig):
    model_config = ModelConfig.from_config(model_config)
  else:
    model_config.validate()
  return ADAPTERS[model_config.kind].module_class(model_config)
