"""`ConfigError`: the project's one error for a bad configuration value (`model.ConfigError`,
`model.config.ConfigError` and `training.config_io.ConfigError` are this class), here at the
bottom so that every package can raise it."""


class ConfigError(ValueError):
  """A bad configuration value; the message names the field."""
