"""Errors of the input pipeline: one clear, single-line message each."""


class DataError(ValueError):
  """Bad data or data config: the message names the file or config field."""


class DataFileError(DataError, FileNotFoundError):
  """A data file is missing or unreadable (the message names the file)."""
