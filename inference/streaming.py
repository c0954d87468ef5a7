"""Text in and out for `decode.py`: whole files, lines from a pipe as they arrive, and the
output formats.

A file is read whole (then sorted by length and decoded in full batches). A pipe or a terminal
is read by a thread as lines arrive (`LineReader`): the decoder takes every line already
waiting (up to a batch) and never waits for more, so each line is answered as soon as it can
be, in input order. `Output` writes and flushes each piece as it is ready: to stdout as it
is, to an `--output_file` into a temporary file beside it, renamed onto it when the run ends
(whole or not at all; see `Output`).
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import stat
import sys
import threading
from collections.abc import Iterator, Sequence

from common.atomic_file import OutputError, OutputFile
from common.errors import carried


class InputError(ValueError):
  """An input that cannot be read (missing, not UTF-8, ...): one line naming file and line."""


def decode_line(raw: bytes, number: int, what: str, name: str) -> str:
  """One line's bytes (without or with its `\\n`, `\\r\\n`) -> text; not UTF-8 -> InputError."""
  raw = raw[:-1] if raw.endswith(b'\n') else raw
  raw = raw[:-1] if raw.endswith(b'\r') else raw
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError as e:
    raise InputError(f'{what} {name} line {number} is not valid UTF-8 (byte '
                     f'0x{raw[e.start]:02x} at column {e.start + 1})') from None


def read_lines(path: str | None, what: str = 'input') -> list[str]:
  """UTF-8 lines of `path` (stdin when None or '-'; `.gz` files are decompressed) without
  their newlines."""
  stdin = path in (None, '-')
  name = '<stdin>' if stdin else path
  try:
    if stdin:
      data = sys.stdin.buffer.read()
    else:
      with open(path, 'rb') as f:
        data = f.read()
      if path.endswith('.gz'):
        data = gzip.decompress(data)
  except (OSError, EOFError) as e:
    reason = getattr(e, 'strerror', None) or e
    raise InputError(f'cannot read {what} file {name}: {reason}') from None
  raw = data.split(b'\n')
  if raw and raw[-1] == b'':
    raw.pop()
  return [decode_line(line, number, what, name) for number, line in enumerate(raw, start=1)]


def stdin_is_stream() -> bool:
  """Whether stdin is a pipe or a terminal (read as lines arrive), not a redirected file."""
  try:
    return not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
  except (OSError, ValueError, AttributeError):
    return True


class LineReader:
  """Lines of a binary stream, read by a daemon thread as they arrive.

  `batches(limit)` yields `(first_index, lines)`: at least one line (waiting for it), plus
  every line already read, up to `limit`; a line never waits for more input. A line that is
  not UTF-8 raises `InputError` after the lines before it were yielded.

  The thread reads the file descriptor with `os.read`, not through a buffered file object: a
  daemon thread blocked inside a BufferedReader's `readline` holds its lock, and an
  interpreter that exits then (an error, Ctrl-C, a closed stdout) aborts with "Fatal Python
  error: _enter_buffered_busy".
  """

  def __init__(self, stream=None, what: str = 'input', name: str = '<stdin>'):
    self._queue: queue.Queue = queue.Queue()
    self.what, self.name = what, name
    self._count = 0
    stream = stream if stream is not None else sys.stdin.buffer
    threading.Thread(target=self._read, args=(stream,), daemon=True).start()

  def _read(self, stream) -> None:
    try:
      for raw in _raw_lines(stream):
        self._queue.put(raw)
    except (OSError, ValueError) as e:  # a closed or unreadable stream ends the input
      self._queue.put(InputError(f'cannot read {self.what} {self.name}: {e}'))
    self._queue.put(None)

  def _next(self, block: bool):
    item = self._queue.get(block=block)
    if isinstance(item, Exception):
      raise item
    return item

  def batches(self, limit: int) -> Iterator[tuple[int, list[str]]]:
    while True:
      raws = [self._next(block=True)]
      while raws[-1] is not None and len(raws) < limit:
        try:
          raws.append(self._next(block=False))
        except queue.Empty:
          break
      ended = raws[-1] is None
      raws = raws[:-1] if ended else raws
      lines, error = [], None
      for raw in raws:
        try:
          lines.append(decode_line(raw, self._count + len(lines) + 1, self.what, self.name))
        except InputError as e:  # the lines before it are answered first
          error = e
          break
      if lines:
        first = self._count
        self._count += len(lines)
        yield first, lines
      if error is not None:
        raise error
      if ended:
        return


def _raw_lines(stream) -> Iterator[bytes]:
  """The lines of `stream` (with their `\\n`), read from its file descriptor in chunks."""
  try:
    fd = stream.fileno()
  except (AttributeError, OSError, ValueError):  # no descriptor (an in-memory stream)
    yield from iter(stream.readline, b'')
    return
  pending = b''
  while chunk := os.read(fd, 1 << 16):
    pending += chunk
    if b'\n' in chunk:
      *lines, pending = pending.split(b'\n')
      yield from (line + b'\n' for line in lines)
  if pending:
    yield pending


class Output:
  """Text to stdout, each `write` flushed as it is ready (a stream is answered line by line),
  or to the file `path` through `common.atomic_file.OutputFile`: checked (no symlink, FIFO,
  device or workdir file: `workdirs` plus any workdir above `path`) and locked against a
  second writer when made, each write appended to a temporary file beside `path`, renamed
  onto `path` by `close()`. So a file appears whole when the run ends, and a run that fails or
  is interrupted leaves `path` as it was. A refusal or a failed write (a full disk, stdout
  too) is one `InputError` line."""

  def __init__(self, path: str | None, workdirs=()):
    self.path, self._file = path, None
    if path is not None:
      try:
        self._file = OutputFile(path, what='--output_file', workdirs=workdirs)
      except OutputError as e:
        raise carried(InputError(str(e)), e) from None

  def write(self, text: str) -> None:
    if not text:
      return
    try:
      if self._file is None:
        sys.stdout.write(text)
        sys.stdout.flush()
      else:
        self._file.write(text)
    except OutputError as e:
      raise carried(InputError(str(e)), e) from None
    except BrokenPipeError:  # the reader went away (`| head`): decode.py stops quietly
      raise
    except OSError as e:  # stdout on a full disk (`> file`, `> /dev/full`)
      _drop_stdout()
      raise carried(InputError(f'cannot write the output to stdout: {e.strerror or e}'),
                    e) from None

  def close(self) -> None:
    """Puts the file in place (stdout: nothing to do)."""
    if self._file is not None:
      try:
        self._file.commit()
      except OutputError as e:
        raise carried(InputError(str(e)), e) from None


def _drop_stdout() -> None:
  """Points stdout at /dev/null: what could not be written stays in its buffer, and the flush
  at exit would otherwise add a traceback to the one-line error."""
  try:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
  except (OSError, ValueError, AttributeError):  # no descriptor (an in-memory stdout)
    pass


_LINE_BREAK = re.compile('\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]')


def format_hypotheses(index: int, source: str, hypotheses: Sequence, fmt: str, nbest: int) -> str:
  """One input line's output. `text`: the best text on one line (newlines folded), or with
  `nbest > 1` one `index<TAB>score<TAB>text` line per hypothesis (index: the input line,
  from 0; none for an empty line); `jsonl`: `{"source", "hypotheses": [{"text", "score",
  "log_prob", "tokens"}, ...]}`, best first."""
  if fmt == 'jsonl':
    return json.dumps({'source': source, 'hypotheses': [h.as_dict() for h in hypotheses]},
                      ensure_ascii=False) + '\n'
  if nbest == 1:
    return (one_line(hypotheses[0].text) if hypotheses else '') + '\n'
  return ''.join(f'{index}\t{h.score:.4f}\t{one_line(h.text)}\n' for h in hypotheses)


def one_line(text: str) -> str:
  """`text` with each line break a reader may see (`str.splitlines`' set: \\r\\n, \\n, \\r,
  \\v, \\f, \\x1c-\\x1e, \\x85, \\u2028, \\u2029) as a space: one input line, one output line,
  for `wc -l`, `readlines()` and `splitlines()` alike (a model's pieces can hold any of them)."""
  return _LINE_BREAK.sub(' ', text)


def format_reference_score(source: str, reference: str, tokens, log_prob: float | None,
                           fmt: str) -> str:
  """`--score_reference`'s line: `log_prob<TAB>reference` (an empty line for an empty source),
  or jsonl `{"source", "reference", "log_prob", "tokens"}` (log_prob null for an empty one)."""
  if fmt == 'jsonl':
    return json.dumps({'source': source, 'reference': reference, 'log_prob': log_prob,
                       'tokens': list(tokens) if log_prob is not None else []},
                      ensure_ascii=False) + '\n'
  return '\n' if log_prob is None else f'{log_prob:.4f}\t{one_line(reference)}\n'


def format_generation(prompt: str, text: str, tokens, fmt: str) -> str:
  """A language model's output for one prompt: the prompt and its continuation, newlines kept
  (as `--prompt` prints it), or jsonl `{"prompt", "text" (the continuation), "tokens"}`."""
  if fmt == 'jsonl':
    return json.dumps({'prompt': prompt, 'text': text, 'tokens': list(tokens)},
                      ensure_ascii=False) + '\n'
  return prompt + text + '\n'
