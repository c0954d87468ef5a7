"""The bounds of the decoding settings: one definition for config.decode's checks
(`training.config_io`) and decode.py's flags (`inference.decode_cli`)."""

ALPHA_MAX = 10.0  # the length penalty ((5 + len) / 6) ** alpha stays finite in float32
# A temperature is 0 (greedy) or within these: below 1e-3, logits / temperature overflow float32.
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-3, 1e3
BEAM_SIZE_MAX = 1024
NBEST_MAX = BEAM_SIZE_MAX  # an n-best list is at most a beam; as many samples per sentence
DECODE_BATCH_MAX = 65_536  # sentences per batch
