"""`ConfigError`: the project's one error for a bad configuration value (`model.ConfigError`,
`model.config.ConfigError` and `workdir.config_io.ConfigError` are this class), here at the
bottom so that every package can raise it."""

import errno

# Exit statuses, the same in every command: a refused command line or input (nothing run, or
# nothing written); a failure under a valid command (a full disk, a file damaged on disk); an
# interruption. An error that is a failure carries `exit_code = EXIT_FAILED`.
EXIT_REFUSED, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130


def exit_code(error: BaseException) -> int:
  """The status an error ends a command with: its own `exit_code`, else a full disk's
  EXIT_FAILED, else EXIT_REFUSED."""
  code = getattr(error, 'exit_code', None)
  if code is not None:
    return code
  return EXIT_FAILED if getattr(error, 'errno', None) == errno.ENOSPC else EXIT_REFUSED


def carried(new: BaseException, old: BaseException) -> BaseException:
  """`new` (a one-line error rewording `old`) with `old`'s exit status."""
  new.exit_code = exit_code(old)
  return new


class ConfigError(ValueError):
  """A bad configuration value; the message names the field."""
