"""A sweep file (configs/sweeps/NAME.py) and the runs it plans: rows of overrides x seeds.

A sweep file is Python, like a preset: its `get_sweep()` returns a `Sweep`.

    from configs.sweeps import Sweep

    def get_sweep():
      return Sweep(
          config='configs/default.py',            # train.py's --config (FILE[:preset])
          overrides={'train.num_steps': 500},     # every row
          rows={'post_ln': {'model.norm_position': 'post'},
                'pre_ln': {'model.norm_position': 'pre'}},
          grid={'optimizer.learning_rate': [0.5, 1.0]},  # crossed with the rows
          seeds=3)                                # or [0, 1, 7]

Each run is `train.py --config=CONFIG --workdir=ROOT/ROW/seed_S --config.FIELD=VALUE ...` with
the sweep's overrides, the row's, then `train.seed=S`. `plan()` resolves every row with the
function train.py runs (`configs.resolve`: the schema's checks, the 'did you mean') and reads
each run's command line back as train.py will, so a typo in the last row is refused, in one
line, before the first row trains.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from common.errors import ConfigError
from configs import resolve
from configs.sweeps import Sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED_FIELD = 'train.seed'
# How the table compares rows: with the baseline row, or each with the row before it (a ladder).
COMPARE = ('baseline', 'previous')
ORDERS = ('row', 'seed')  # the order runs start in: row by row, or seed by seed
# A row's name is a directory name: no separators, nothing a shell or SLURM would mangle; short
# enough for its files (`.sweep/status/ROW.seed_S.json`) to stay under a file name's 255 bytes.
_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.=+-]*')
MAX_NAME = 160
# A plan larger than these is a mistake (seeds=10**9, a grid of a million points), refused by
# its size before it is built: planning checks each row (~10 ms), and a table of thousands of
# rows is no comparison.
MAX_RUNS, MAX_ROWS = 10_000, 1_000


class SweepError(ConfigError):
  """A sweep file that cannot be planned; the message names the row and field, in one line."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a sweep: its row, seed, workdir and train.py arguments."""

  row: str
  seed: int
  workdir: str
  args: tuple[str, ...]  # train.py's arguments, --workdir included
  num_steps: int
  translates: bool  # a model with a source: evaluated by BLEU, else by validation loss

  @property
  def name(self) -> str:
    return f'{self.row}/seed_{self.seed}'


@dataclasses.dataclass(frozen=True)
class Plan:
  """Every run of a sweep, in the order they start (`Sweep.order`: row by row, or seed by seed)."""

  sweep: Sweep
  path: str  # the sweep file
  root: str
  rows: tuple[str, ...]
  row_overrides: Mapping[str, Mapping[str, Any]]
  runs: tuple[Run, ...]
  baseline: str
  # Row -> its resolved config (JSON values, `train.seed` the first seed's): what each run of
  # the row must have trained with (`run_config`); the table counts no other run.
  configs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

  def reference(self, row: str) -> str | None:
    """The row that `row` is compared with in the table (None: the baseline itself)."""
    if self.sweep.compare == 'previous':
      index = self.rows.index(row)
      return self.rows[index - 1] if index else None
    return None if row == self.baseline else self.baseline


def load(path: str) -> Sweep:
  """The `Sweep` of the file at `path`; `SweepError` (one line) if it is not one."""
  if not os.path.isfile(path):
    what = 'is not a file' if os.path.exists(path) else 'not found'
    raise SweepError(f'sweep file {path!r} {what} (--sweep=configs/sweeps/NAME.py)')
  try:
    sweep = resolve.call_in_file(path, 'get_sweep')
  except SystemExit as e:  # sys.exit() in the file: no plan, and no silent exit 0
    raise SweepError(f'{path}: the sweep file called sys.exit({e.code!r}) (a sweep file '
                     'defines get_sweep() -> Sweep)') from None
  except AttributeError as e:
    raise SweepError(f'{path}: {e} (a sweep file defines get_sweep() -> Sweep)') from None
  except Exception as e:  # noqa: BLE001  (the file is code: any error is its error)
    raise SweepError(f'{path}: {type(e).__name__}: {e}') from None
  if not isinstance(sweep, Sweep):
    raise SweepError(f'{path}: get_sweep() returned {type(sweep).__name__}, not a Sweep')
  return sweep


def seeds_of(sweep: Sweep) -> list[int]:
  seeds = sweep.seeds
  if isinstance(seeds, int) and not isinstance(seeds, bool):
    if seeds < 1:
      raise SweepError(f'seeds={seeds} must be at least 1 (a count) or a list of seeds')
    if seeds > MAX_RUNS:
      raise SweepError(f'seeds={seeds} would plan {seeds:,} runs a row: a sweep has at most '
                       f'{MAX_RUNS:,} runs')
    return list(range(seeds))
  if (isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds
      or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
    raise SweepError(f'seeds={seeds!r} must be a count or a non-empty list of seeds >= 0')
  if len(set(seeds)) != len(seeds):
    raise SweepError(f'seeds={list(seeds)} lists a seed twice')
  return list(seeds)


def _value_name(value: Any) -> str:
  return repr(value) if isinstance(value, str) and not value else str(value)


def expand_rows(sweep: Sweep) -> dict[str, dict[str, Any]]:
  """Row name -> its overrides: the named rows crossed with the grid's points."""
  if not isinstance(sweep.rows, Mapping) or not isinstance(sweep.grid, Mapping):
    raise SweepError('rows must map names to overrides, grid fields to lists of values')
  for field, values in sweep.grid.items():
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
      raise SweepError(f'grid[{field!r}]={values!r} must be a non-empty list of values')
  named = dict(sweep.rows) or {'base': {}}
  for name in named:
    if not isinstance(name, str):
      raise SweepError(f'row name {name!r} is {type(name).__name__}, not a string: a row\'s '
                       'name is a directory name')
  check_size(sweep)
  points = [dict(zip(sweep.grid, values, strict=True))
            for values in itertools.product(*sweep.grid.values())]
  rows = {}
  for name, overrides in named.items():
    if not isinstance(overrides, Mapping):
      raise SweepError(f'row {name!r}: its overrides must be a dict of field -> value')
    for point in points:
      parts = ([name] if sweep.rows else []) + [
          f'{field.rsplit(".", 1)[-1]}={_value_name(v)}' for field, v in point.items()]
      full = '+'.join(parts) or name
      clash = sorted(set(overrides) & set(point))
      if clash:
        raise SweepError(f'row {name!r} and the grid both set {clash}')
      rows[full] = {**overrides, **point}
  for name in rows:
    if not _NAME.fullmatch(name) or name in ('.', '..'):
      raise SweepError(f'row name {name!r} is not a directory name (letters, digits and '
                       '_.=+- only): name the rows, or use simpler grid values')
    if len(name) > MAX_NAME:
      raise SweepError(f'row name {name[:40]!r}... has {len(name)} characters, more than '
                       f'{MAX_NAME} (its files\' names would be too long): a shorter name')
  return rows


def check_size(sweep: Sweep) -> None:
  """Refuses a plan of more than MAX_ROWS rows or MAX_RUNS runs, by its size alone (nothing
  built: seeds=10**9 or a grid of 10**6 points would exhaust memory or plan for hours)."""
  seeds = sweep.seeds
  count = seeds if isinstance(seeds, int) else len(seeds) if isinstance(seeds, Sequence) else 1
  rows = max(len(sweep.rows), 1)
  for values in sweep.grid.values():
    rows *= len(values)
  runs = rows * max(int(count), 1)
  if rows > MAX_ROWS or runs > MAX_RUNS:
    raise SweepError(f'the sweep plans {rows:,} row(s) x {max(int(count), 1):,} seed(s) = '
                     f'{runs:,} runs: at most {MAX_ROWS:,} rows and {MAX_RUNS:,} runs (a '
                     'smaller grid, fewer seeds)')


def flag_value(value: Any) -> str:
  """A Python value as train.py's `--config.FIELD=` text (parsed back by config_flags)."""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def _check_fields(config, overrides: Mapping[str, Any], where: str) -> None:
  """Every overridden field exists (the resolver's 'did you mean' for a typo)."""
  try:
    resolve.check_fields(config, list(overrides))
  except resolve.UnknownField as e:
    raise SweepError(f'{where}: {e}') from None


def _same(a: Any, b: Any) -> bool:
  """Equal values, a NaN equal to a NaN (the schema then says what is wrong with it)."""
  return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _resolve(config_file: str, preset, overrides: Mapping[str, Any], where: str):
  """The resolved config of one run, by the resolver train.py runs (checked against the
  schema, as --show_config checks it), and the values its command line (`--config.F=TEXT`)
  reads back: each must be the row's."""
  try:
    config, _ = resolve.resolve(preset, overrides)
  except ConfigError as e:
    raise SweepError(f'{where}: {e}') from None
  try:
    parsed = resolve.parse_command_line(
        config_file, [f'--config.{k}={flag_value(v)}' for k, v in overrides.items()])
  except ConfigError as e:
    raise SweepError(f'{where}: {e}') from None
  for field, value in overrides.items():
    if not _same(parsed.get(field), value):
      raise SweepError(f'{where}: config.{field}={value!r} does not survive train.py\'s '
                       f'command line (it reads {flag_value(value)!r} as {parsed.get(field)!r})')
  return config


def plan(sweep: Sweep, root: str, path: str = '') -> Plan:
  """Every run of `sweep` under `root`, each run's command line checked; `SweepError` names
  the first bad row."""
  from model.kinds import adapter_of  # pylint: disable=import-outside-toplevel
  config_file = sweep.config.partition(':')[0]
  config_path = config_file if os.path.isabs(config_file) else os.path.join(REPO, config_file)
  if not os.path.isfile(config_path):
    raise SweepError(f'config {sweep.config!r} not found (a train.py --config, relative to the '
                     'repository)')
  config_arg = os.path.join(REPO, sweep.config) if not os.path.isabs(config_file) else sweep.config
  seeds = seeds_of(sweep)
  rows = expand_rows(sweep)
  try:
    base = resolve.load(config_arg)
  except ConfigError as e:  # (its text names the file already: once is enough)
    raise SweepError(f'config {sweep.config!r}: {str(e).removeprefix(config_arg + ": ")}'
                     ) from None
  _check_fields(base, sweep.overrides, 'the sweep\'s overrides')
  baseline = sweep.baseline if sweep.baseline is not None else next(iter(rows))
  if baseline not in rows:
    raise SweepError(f'baseline={baseline!r} is not a row; rows: {list(rows)}')
  if sweep.order not in ORDERS:
    raise SweepError(f'order={sweep.order!r} is not one of {list(ORDERS)}')
  if sweep.compare not in COMPARE:
    raise SweepError(f'compare={sweep.compare!r} is not one of {list(COMPARE)}')
  if sweep.compare == 'previous' and baseline != next(iter(rows)):
    raise SweepError(f"compare='previous' compares each row with the one before it: its "
                     f'baseline is the first row ({next(iter(rows))!r}), not {baseline!r}')
  runs, configs = [], {}
  for name, row in rows.items():
    where = f'row {name!r}'
    _check_fields(base, row, where)
    if SEED_FIELD in row or SEED_FIELD in sweep.overrides:
      raise SweepError(f'{where}: {SEED_FIELD} comes from seeds=, not from overrides')
    overrides = {**sweep.overrides, **row}
    config = _resolve(config_arg, base, {**overrides, SEED_FIELD: seeds[0]}, where)
    configs[name] = json.loads(json.dumps(config.to_dict(), default=str))
    translates = adapter_of(config.model).has_source
    for seed in seeds:
      workdir = os.path.join(root, name, f'seed_{seed}')
      args = (f'--config={config_arg}', f'--workdir={workdir}',
              *(f'--config.{k}={flag_value(v)}' for k, v in {**overrides,
                                                            SEED_FIELD: seed}.items()))
      runs.append(Run(name, seed, workdir, args, int(config.train.num_steps), translates))
  _check_metric(sweep, runs)
  if sweep.order == 'seed':
    runs.sort(key=lambda r: seeds.index(r.seed))  # stable: rows keep their order per seed
  return Plan(sweep, path, root, tuple(rows), rows, tuple(runs), baseline, configs)


def run_config(plan: Plan, run: Run) -> dict[str, Any]:
  """The resolved config `run` trains with (JSON values: as its config.json holds them)."""
  config = json.loads(json.dumps(plan.configs[run.row]))
  section, field = SEED_FIELD.split('.')
  config[section][field] = run.seed
  return config


# Fields a run takes from config.train.init_from's workdir, not from its row.
_FROM_INIT = ('data.tokenizer', 'data.vocab_size')


def config_differences(wanted: Mapping[str, Any], saved: Mapping[str, Any],
                       overridden: Sequence[str] = ()) -> list[str]:
  """Each field (`section.field`) whose value in `saved` (a run's config.json) is not the one
  in `wanted` (`run_config`), as `field=SAVED (the row: WANTED)`. With
  `train.init_from`, the model section and the tokenizer are the source's: only the model
  fields in `overridden` are compared there."""
  init_from = bool((wanted.get('train') or {}).get('init_from'))
  out = []
  for section, fields in wanted.items():
    found = saved.get(section)
    for field, value in fields.items():
      name = f'{section}.{field}'
      if init_from and ((section == 'model' and name not in overridden) or name in _FROM_INIT):
        continue
      have = found.get(field, '(missing)') if isinstance(found, Mapping) else '(missing)'
      if not _same(have, value):
        out.append(f'{name}={have!r} (the row: {value!r})')
  return out


def selected(plan: Plan, only: Sequence[str]) -> list[Run]:
  """The runs of `plan` that `only` names (none: all): a pattern (`fnmatch`: `*`, `?`, `[..]`)
  matches a run's name (`ROW/seed_S`) or its row. A pattern that matches no run is refused
  (SweepError), as a typo would otherwise run nothing."""
  if not only:
    return list(plan.runs)
  for pattern in only:
    if not any(fnmatch.fnmatchcase(name, pattern) for r in plan.runs for name in (r.name, r.row)):
      raise SweepError(f'--only={pattern} matches no run of this sweep (runs are ROW/seed_S: '
                       f'{", ".join(r.name for r in plan.runs[:4])}'
                       f'{", ..." if len(plan.runs) > 4 else ""})')
  return [r for r in plan.runs
          if any(fnmatch.fnmatchcase(name, p) for p in only for name in (r.name, r.row))]


def _check_metric(sweep: Sweep, runs: list[Run]) -> None:
  from experiments import evaluate  # pylint: disable=import-outside-toplevel
  kinds = {run.translates for run in runs}
  if len(kinds) > 1:
    raise SweepError('the rows mix translation and language models: one table compares one '
                     'kind')
  known = evaluate.METRICS if kinds == {True} else evaluate.LM_METRICS
  metric = sweep.metric if kinds == {True} or sweep.metric != 'bleu' else 'loss'
  if metric not in known:
    raise SweepError(f'metric={sweep.metric!r} is not one of {list(known)}')
  try:
    evaluate.check_settings(dict(sweep.decode))
  except ValueError as e:
    raise SweepError(str(e)) from None
  cap = sweep.eval_sentences
  if cap is not None and not (isinstance(cap, int) and not isinstance(cap, bool) and cap > 0):
    raise SweepError(f'eval_sentences={cap!r} must be a positive integer or None (all)')
