"""Curves and a table of one or several runs, without TensorBoard.

  python -m experiments.report --workdir=runs/a [--workdir=runs/b ...] --output_dir=DIR

reads each workdir's TensorBoard event files (the records tensorboardX writes, parsed with
tensorboardX's own protobuf classes: neither TensorFlow nor TensorBoard is needed) and writes

  DIR/curves.png   train loss, learning rate, validation loss and validation BLEU against the
                   step (left) and the wall time (right), every run in each panel
  DIR/summary.md   a Markdown table of each run's final and best figures (also printed)

A resumed run is one run: its sessions (one event file each) are joined, the steps a later
session redid replace the earlier session's, and the wall time counts the sessions' own time,
not the pauses between them.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import os
import statistics
import struct
import sys
from collections.abc import Callable

from absl import app, flags

from common.atomic_file import make_output_dir, write_output
from common.files import read_regular
from common.tensorboardx import tensorboardx
from workdir import cli

PANELS = (('train/loss', 'train loss'), ('train/learning_rate', 'learning rate'),
          ('eval/loss', 'validation loss'), ('eval/bleu', 'validation BLEU'))


@dataclasses.dataclass
class Point:
  step: int
  minutes: float  # wall time of the run's sessions up to this point
  value: float


@dataclasses.dataclass
class Run:
  """One workdir's scalars {tag: [Point] by step} and texts {tag: latest text}."""

  name: str
  scalars: dict[str, list[Point]]
  texts: dict[str, str]
  minutes: float  # the sessions' total wall time


def read_records(path: str, warn: Callable[[str], None] | None = None):
  """The records of one TFRecord file (8-byte length, its masked CRC-32C, data, the data's):
  stops quietly at a truncated last record (a run killed while writing), and at the first
  record whose length or data fails its CRC, with a `warn` naming the file and the offset
  (a flipped bit would otherwise read as another step, loss or wall time)."""
  masked_crc32c = tensorboardx().record_writer.masked_crc32c
  data = read_regular(path)  # a FIFO planted there would block an open() forever
  pos = 0
  while pos + 12 <= len(data):
    header, (length_crc,) = data[pos:pos + 8], struct.unpack('<I', data[pos + 8:pos + 12])
    (length,) = struct.unpack('<Q', header)
    end = pos + 12 + length
    if masked_crc32c(header) != length_crc:
      return _damaged(path, pos, warn)
    if end + 4 > len(data):
      return
    (data_crc,) = struct.unpack('<I', data[end:end + 4])
    if masked_crc32c(data[pos + 12:end]) != data_crc:
      return _damaged(path, pos, warn)
    yield data[pos + 12:end]
    pos = end + 4


def _damaged(path: str, offset: int, warn) -> None:
  if warn is not None:
    warn(f'{path}: the record at byte {offset} is damaged (CRC mismatch); it and the records '
         'after it are left out')


def read_events(path: str, warn: Callable[[str], None] | None = None
                ) -> list[tuple[float, int, str, object]]:
  """-> [(wall_time, step, tag, float value or str text)] of one event file (`warn`: as
  `read_records`)."""
  event_pb2 = tensorboardx().proto.event_pb2
  out = []
  for record in read_records(path, warn):
    event = event_pb2.Event()
    try:
      event.ParseFromString(record)
    except Exception:  # pylint: disable=broad-except  (a damaged record: the rest is unsafe)
      break
    for value in event.summary.value:
      if value.HasField('simple_value'):
        out.append((event.wall_time, event.step, value.tag, float(value.simple_value)))
      elif value.HasField('tensor') and value.tensor.string_val:
        tag = value.tag.removesuffix('/text_summary')
        out.append((event.wall_time, event.step, tag, value.tensor.string_val[0].decode()))
  return out


def _redone(events: list[tuple]) -> int | None:
  """The first step a session redid, if any. train.py logs its config text at the step it starts
  from (a checkpoint's), and trains the steps after it: a finished run opened again (it only
  evaluates its last step) redoes none of its steps. Event files without the text: their first
  scalar's step."""
  texts = [step for _, step, _, value in events if isinstance(value, str)]
  if texts:
    return min(texts) + 1
  return min((step for _, step, _, _ in events), default=None)


def load_run(workdir: str, name: str | None = None,
             warn: Callable[[str], None] | None = None) -> Run:
  """Joins the sessions (event files) of `workdir` into one `Run`; `warn` hears of damaged
  records (`read_records`). Raises FileNotFoundError."""
  paths = glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))
  sessions = [events for events in (read_events(p, warn) for p in paths) if events]
  if not sessions:
    raise FileNotFoundError(f'no TensorBoard events in {workdir} (is it a train.py workdir?)')
  sessions.sort(key=lambda events: events[0][0])
  scalars: dict[str, dict[int, Point]] = {}
  texts: dict[str, str] = {}
  offset = 0.0  # minutes of the sessions before this one
  for events in sessions:
    start = events[0][0]
    redone = _redone(events)
    if redone is not None:  # steps this session redid replace the earlier ones
      for points in scalars.values():
        for step in [s for s in points if s >= redone]:
          del points[step]
    for wall, step, tag, value in events:
      if isinstance(value, str):
        texts[tag] = value
      else:
        scalars.setdefault(tag, {})[step] = Point(step, offset + (wall - start) / 60, value)
    offset += (max(e[0] for e in events) - start) / 60
  return Run(name or os.path.basename(os.path.normpath(workdir)),
             {tag: [p[s] for s in sorted(p)] for tag, p in scalars.items() if p}, texts, offset)


def median_step_ms(workdir: str) -> float | None:
  """The run's median training step (ms, train.py's `train/step_ms`), None before any."""
  try:
    ms = [p.value for p in load_run(workdir).scalars.get('train/step_ms', [])]
  except (FileNotFoundError, OSError):
    return None
  return statistics.median(ms) if ms else None


def _fmt(value: float | None, digits: int = 4) -> str:
  return '-' if value is None else f'{value:.{digits}f}'


def _best(points: list[Point], highest: bool) -> str:
  if not points:
    return '-'
  best = (max if highest else min)(points, key=lambda p: p.value)
  return f'{best.value:.{2 if highest else 4}f} (step {best.step})'


def summary_table(runs: list[Run]) -> str:
  """A Markdown table: each run's last step, wall time, final and best figures."""
  lines = ['| run | steps | wall time | final train loss | final val loss | best val loss | '
           'final val BLEU | best val BLEU | median ms/step |',
           '|---|---|---|---|---|---|---|---|---|']
  for run in runs:
    s = run.scalars

    def last(tag: str, s=s) -> float | None:
      return s[tag][-1].value if s.get(tag) else None

    steps = max((p.step for points in s.values() for p in points), default=0)
    ms = [p.value for p in s.get('train/step_ms', [])]
    lines.append(' | '.join([
        f'| {run.name}', str(steps), f'{run.minutes:.1f} min', _fmt(last('train/loss')),
        _fmt(last('eval/loss')), _best(s.get('eval/loss', []), False),
        _fmt(last('eval/bleu'), 2), _best(s.get('eval/bleu', []), True),
        _fmt(statistics.median(ms) if ms else None, 1)]) + ' |')
  return '\n'.join(lines) + '\n'


def plot_curves(runs: list[Run], path: str, workdirs=()) -> str:
  """The panels of `PANELS` that any run has, against step and wall time -> `path` (PNG,
  written as every output is: `common.atomic_file.write_output`)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  panels = [(tag, title) for tag, title in PANELS if any(r.scalars.get(tag) for r in runs)]
  if not panels:
    raise ValueError('none of the runs has train or eval scalars to plot')
  fig, axes = plt.subplots(len(panels), 2, figsize=(11, 2.6 * len(panels)), squeeze=False,
                           sharex='col')
  for row, (tag, title) in enumerate(panels):
    for col, xlabel in enumerate(('step', 'wall time (min)')):
      ax = axes[row][col]
      for run in runs:
        points = run.scalars.get(tag, [])
        if points:
          x = [p.step if col == 0 else p.minutes for p in points]
          ax.plot(x, [p.value for p in points], marker='o' if len(points) < 20 else None,
                  markersize=3, label=run.name)
      ax.set_title(title, fontsize=10)
      if row == len(panels) - 1:  # the columns share their x axis
        ax.set_xlabel(xlabel, fontsize=9)
      ax.grid(alpha=0.3)
      if tag == 'train/loss' and len(runs) > 1:
        ax.legend(fontsize=8)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=110)
  plt.close(fig)
  write_output(path, png.getvalue(), what='report file', workdirs=workdirs)
  return path


def report(workdirs: list[str], output_dir: str, names: list[str] | None = None,
           warn: Callable[[str], None] | None = None) -> dict:
  """Writes curves.png and summary.md for `workdirs` into `output_dir` -> their paths and the
  table (`warn`: as `read_records`). Each file is written whole or not at all, never through a
  symlink or over a workdir's own file (`common.atomic_file`: `OutputError`, one line)."""
  names = names or [None] * len(workdirs)
  runs = [load_run(w, n, warn) for w, n in zip(workdirs, names, strict=True)]
  make_output_dir(output_dir, what='--output_dir', workdirs=workdirs)
  table = summary_table(runs)
  table_path = os.path.join(output_dir, 'summary.md')
  curves = plot_curves(runs, os.path.join(output_dir, 'curves.png'), workdirs)
  write_output(table_path, table, what='report file', workdirs=workdirs)
  return {'curves': curves, 'summary': table_path, 'table': table}


def _define_flags() -> None:
  flags.DEFINE_multi_string('workdir', None, 'A train.py workdir (repeat to compare runs).')
  flags.DEFINE_string('output_dir', None, 'Where curves.png and summary.md go.')
  flags.DEFINE_list('names', None, 'Names of the runs in the legend and table, in --workdir '
                    'order (default: the workdirs\' last path components).')


PROG = 'python -m experiments.report'


def main(argv: list[str]) -> None:
  prog = PROG
  if len(argv) > 1:
    cli.fail(prog, f'unexpected arguments {argv[1:]}')
  f = flags.FLAGS
  if not f.workdir or not f.output_dir:
    cli.fail(prog, '--workdir=DIR (one or more) and --output_dir=DIR are required')
  if f.names is not None and len(f.names) != len(f.workdir):
    cli.fail(prog, f'--names has {len(f.names)} names for {len(f.workdir)} workdirs')
  try:
    out = report(f.workdir, f.output_dir, f.names,
                 warn=lambda m: print(f'{prog}: warning: {m}', file=sys.stderr, flush=True))
  except (FileNotFoundError, ValueError) as e:
    cli.fail(prog, e)
  except OSError as e:
    cli.fail(prog, f'{e.filename}: {e.strerror or e}' if e.filename else e, code=1)
  print(out['table'], end='')
  print(f'wrote {out["curves"]} and {out["summary"]}')


if __name__ == '__main__':
  _define_flags()
  app.run(main, flags_parser=cli.absl_flags_parser(PROG))
