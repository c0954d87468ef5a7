"""A longer, better Multi30k En->De run than the default: 4+4 layers, 64 packed rows a step,
5000 steps (about 22 epochs), dropout 0.2, evaluated on the whole validation set."""

from configs import default


def get_config(preset=None):
  config = default.get_config(preset)
  if preset is None:
    m = config.model
    m.d_model, m.d_ff, m.num_heads = 256, 1024, 4
    m.num_encoder_layers = m.num_decoder_layers = 4
    m.dropout_rate = 0.2
    config.optimizer.learning_rate = 0.5  # peak 0.5 * 256^-0.5 * 800^-0.5 = 1.1e-3
    config.optimizer.warmup_steps = 800
    config.train.batch_size = 64
    config.train.num_steps = 5000
    config.train.eval_every_steps = 1000
    config.train.checkpoint_every_steps = 500
    config.train.max_checkpoints = 5
    config.train.log_every_steps = 100
    config.decode.num_eval_sentences = 1014
  return config
