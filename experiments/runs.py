"""A sweep's runs on disk, as the plan and the table both read them: which are done (trained to
their last step, evaluated with this sweep's setting, their outputs whole), whether each was
trained with its row's config, and the sweep's own files written whole. Below `launch` (which
runs the jobs) and `table` (which reports them), so that neither imports the other.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from common.errors import EXIT_FAILED, carried
from experiments import evaluate
from experiments.sweep_file import Plan, Run, SweepError, config_differences, run_config


def eval_settings(plan: Plan) -> dict[str, Any]:
  return {evaluate.AVERAGE_LAST: 1, **plan.sweep.decode}


def evaluated(plan: Plan, run: Run) -> dict[str, Any] | None:
  """The results of `run` if it is done: its results.json valid (`evaluate.check_results`),
  of its last step, beside its config.json (which `check_runs` compares with the row's),
  evaluated with this sweep's setting, its outputs whole (`evaluate.outputs_problem`); else
  None. What the plan counts done is what the table shows."""
  from workdir import config_io  # pylint: disable=import-outside-toplevel
  results = evaluate.read_results(run.workdir)
  if results is None or results.get('step') != run.num_steps:
    return None
  if not os.path.isfile(config_io.config_path(run.workdir)):  # nothing to check it against
    return None
  if not run.translates:
    return results
  if (results.get('decode') is None or not _same_decode(results, plan, run)
      or results.get('eval_sentences') != plan.sweep.eval_sentences
      or evaluate.outputs_problem(run.workdir, results) is not None):
    return None
  return results


def _same_decode(results: dict, plan: Plan, run: Run) -> bool:
  """The evaluation used the sweep's decoding setting (its average capped by the checkpoints
  kept, as `evaluate` caps it)."""
  wanted = eval_settings(plan)
  if evaluate.is_grid(wanted):  # chosen on validation: the grid must be this sweep's
    grid = results.get('decode_grid') or {}
    return (grid.get('choices') == json.loads(json.dumps(wanted))
            and grid.get('metric') == plan.sweep.metric)
  recorded = dict(results['decode'])
  average = recorded.pop(evaluate.AVERAGE_LAST, 1)
  wanted_average = wanted.pop(evaluate.AVERAGE_LAST)
  return recorded == wanted and average <= wanted_average


def check_runs(plan: Plan) -> None:
  """Every run of `plan` that has started (its config.json) trained with its row's resolved
  config, field by field (`sweep_file.config_differences`): a run restored from another
  sweep's archive, or trained before its config file changed, is never counted as the row's.
  `SweepError` (one line) names the first that did not and its fields."""
  from workdir import config_io  # pylint: disable=import-outside-toplevel
  for run in plan.runs:
    path = config_io.config_path(run.workdir)
    if not os.path.lexists(path):
      continue
    try:
      saved = config_io.to_dict(config_io.load_config(run.workdir))
    except ValueError as e:  # ConfigError: unreadable, not a config, a FIFO
      raise SweepError(f'{run.name}: {e} (nothing was changed)') from None
    overridden = [*plan.sweep.overrides, *plan.row_overrides[run.row]]
    differences = config_differences(run_config(plan, run), saved, overridden)
    if differences:
      more = f' and {len(differences) - 3} more' if len(differences) > 3 else ''
      raise SweepError(f'{run.workdir} was not trained with the config of row {run.row!r}: '
                       f'{"; ".join(differences[:3])}{more} (another sweep\'s run, or its '
                       'config file changed since): move it away or use another --root; '
                       'its table would mix configs (nothing was changed)')


def write_file(path: str, data: bytes) -> None:
  """The sweep's own file `path` written whole (`atomic_write`), its directory made; a failure
  (a full disk) is one `SweepError` line naming the file, with exit status 1."""
  from common.atomic_file import atomic_write  # pylint: disable=import-outside-toplevel
  try:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, data)
  except OSError as e:
    reason = 'no space left on device' if e.errno == errno.ENOSPC else e.strerror or str(e)
    error = carried(SweepError(f'cannot write {path}: {reason}'), e)
    error.exit_code = EXIT_FAILED
    raise error from None
