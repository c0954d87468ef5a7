"""The Transformer: pure attention functions (`model.attention`), Linen modules, decoding."""

from model.config import ConfigError, ModelConfig
from model.transformer import (DecoderOnly, EncoderDecoder, EncoderOnly, build_model,
                               shift_right)

__all__ = ['ConfigError', 'ModelConfig', 'EncoderDecoder', 'DecoderOnly', 'EncoderOnly',
           'build_model', 'shift_right']
