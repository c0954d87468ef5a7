"""A longer, better Multi30k En->De run (at most ~60 minutes on 2 CPU cores)."""

from configs import default


def get_config(preset=None):
  config = default.get_config(preset)
  if preset is None:
    config.model.d_model, config.model.d_ff, config.model.num_heads = 256, 1024, 4
    config.model.num_encoder_layers = config.model.num_decoder_layers = 4
    config.model.dropout_rate = 0.2
    config.train.num_steps = 12_000
    config.train.eval_every_steps = 2000
    config.train.checkpoint_every_steps = 1000
    config.train.max_checkpoints = 5
    config.decode.num_eval_sentences = 1014
  return config
