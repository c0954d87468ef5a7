"""The evaluation every run of a sweep gets, the same for all: after its training, in its job.

A translation model decodes the whole validation and test splits of its config's dataset with
the sweep's one decoding setting (through `inference.load`: decode.py's path), writes the
outputs beside the references in `WORKDIR/sweep_eval/`, and is scored with cased sacreBLEU,
the literature's lowercased tokenized BLEU (Multi30k papers' multi-bleu.perl) and chrF2, each
with its signature. A setting given as a list is a choice made on validation, per run: the
validation split is decoded with every combination of the lists (`grid_points`), the best
validation score of the sweep's metric chooses (ties: the first in the lists' order, so list
the cheaper decode first), and the test split is decoded once, with the choice. A language
model is scored by its validation loss: the trainer's evaluation at the last step (every
`train.num_eval_batches` batch of the split). Everything goes in
`WORKDIR/sweep_eval/results.json`, written last: a run is evaluated when that file exists and
names the same decoding setting (or grid).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

EVAL_DIR = 'sweep_eval'
RESULTS_FILE = 'results.json'
SPLITS = ('validation', 'test')  # the names in results.json; the config says which tfds split
METRICS = ('bleu', 'bleu_lowercased', 'chrf2')  # translation, higher is better
LM_METRICS = ('loss',)  # language model, lower is better
AVERAGE_LAST = 'average_last'  # checkpoints averaged (decode.py's --average_last)
STRATEGY = 'strategy'  # a row of the strategy table (default: beam, greedy at beam size 1)


def grid_points(decode: Mapping[str, Any]) -> list[dict[str, Any]]:
  """The decoding settings `decode` gives: one, or one per combination of the values of its
  settings given as lists (the first setting's values outermost), in the lists' order."""
  values = [v if isinstance(v, (list, tuple)) else [v] for v in decode.values()]
  return [dict(zip(decode, point, strict=True)) for point in itertools.product(*values)]


def is_grid(decode: Mapping[str, Any]) -> bool:
  return any(isinstance(v, (list, tuple)) for v in decode.values())


def check_settings(decode: Mapping[str, Any]) -> None:
  """The sweep's decoding setting: settings of the strategy table, `strategy` and
  `average_last`, each a value or a list of values to choose from on validation; raises
  ValueError (one line)."""
  from autoregressive import strategies  # pylint: disable=import-outside-toplevel
  known = {*strategies.fields(), STRATEGY, AVERAGE_LAST}
  unknown = sorted(set(decode) - known)
  if unknown:
    raise ValueError(f'decode has unknown setting(s) {unknown}; known: {sorted(known)}')
  for name, value in decode.items():
    if isinstance(value, (list, tuple)) and (not value or len(set(map(repr, value))) < len(value)):
      raise ValueError(f'decode[{name!r}]={list(value)!r}: a choice lists distinct values, at '
                       'least one')
  for point in grid_points(decode):
    average = point.get(AVERAGE_LAST, 1)
    if not (isinstance(average, int) and not isinstance(average, bool) and average >= 1):
      raise ValueError(f'decode[{AVERAGE_LAST!r}]={average!r} must be an integer >= 1')
    settings = {k: v for k, v in point.items() if k not in (AVERAGE_LAST, STRATEGY)}
    strategies.from_config({}, settings, strategy=point.get(STRATEGY),
                           where=lambda name: f'decode[{name!r}]')


def results_path(workdir: str) -> str:
  return os.path.join(workdir, EVAL_DIR, RESULTS_FILE)


def read_json_object(path: str) -> dict[str, Any] | None:
  """A JSON object file (a regular file only: a FIFO would block), or None when it is
  missing, unreadable or not an object."""
  from common.files import read_regular  # pylint: disable=import-outside-toplevel
  try:
    found = json.loads(read_regular(path))
  except (OSError, ValueError):
    return None
  return found if isinstance(found, dict) else None


def read_results(workdir: str) -> dict[str, Any] | None:
  """results.json of an evaluated run, or None (not evaluated, unreadable, or damaged:
  `check_results`)."""
  found = read_json_object(results_path(workdir))
  return found if found is not None and check_results(found) is None else None


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_results(found: Any) -> str | None:
  """What is wrong with a results.json's content for the sweep's states and table (a value of
  another type than `evaluate` writes), in words; None when nothing is."""
  if not isinstance(found, dict):
    return f'not a JSON object but {type(found).__name__}'
  checks = (('step', _count, 'an integer >= 0'),
            ('parameters', _count, 'an integer >= 0'),
            ('eval_wall_s', _number, 'a number'),
            ('eval_sentences', lambda v: v is None or _count(v), 'an integer or null'),
            ('decode', lambda v: isinstance(v, dict), 'an object'),
            ('decode_grid', lambda v: isinstance(v, dict), 'an object'),
            ('search', lambda v: isinstance(v, str), 'a string'),
            ('warnings', lambda v: isinstance(v, list), 'a list'))
  for key, valid, words in checks:
    if (key in found or key == 'step') and not valid(found.get(key)):
      return f'{key!r} is {found.get(key)!r}, not {words}'
  for split in SPLITS:
    section = found.get(split, {})
    if not isinstance(section, dict):
      return f'{split!r} is {section!r}, not an object'
    for key, value in section.items():
      text = key == 'split' or key.endswith('_signature')
      if not (isinstance(value, str) if text else _number(value)):
        return f'{split}.{key} is {value!r}, not {"a string" if text else "a number"}'
  return None


def json_file_problem(path: str, check) -> str | None:
  """Why the JSON file at `path` is not read (a FIFO, not JSON, or what `check` of its value
  says), or None (also when it does not exist)."""
  from common.files import read_regular  # pylint: disable=import-outside-toplevel
  try:
    found = json.loads(read_regular(path))
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    return ' '.join(str(e).split())
  return check(found)


def results_problem(path: str) -> str | None:
  """Why the results.json at `path` is not read (a FIFO, not JSON, `check_results`), or None."""
  return json_file_problem(path, check_results)


def read_lines(path: str) -> list[str] | None:
  """The lines of an output or reference file (a regular file only), or None."""
  from common.files import read_regular  # pylint: disable=import-outside-toplevel
  try:
    return read_regular(path).decode('utf-8').split('\n')[:-1]
  except (OSError, ValueError):
    return None


def outputs_problem(workdir: str, results: Mapping[str, Any]) -> str | None:
  """What is wrong with a translation run's outputs beside its results.json (a file missing,
  unreadable, or with another number of lines than the split's sentences), or None."""
  for split in SPLITS:
    sentences = (results.get(split) or {}).get('sentences')
    for what in ('hyp', 'ref'):
      path = split_file(workdir, split, what)
      lines = read_lines(path)
      if lines is None:
        return f'{os.path.basename(path)} is missing or unreadable'
      if sentences is not None and len(lines) != sentences:
        return (f'{os.path.basename(path)} has {len(lines)} lines, results.json says '
                f'{sentences:g}')
  return None


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
  """Cased sacreBLEU, lowercased 13a-tokenized BLEU and chrF2 (`common.scores`), with their
  signatures, as results.json keeps them."""
  from common.scores import corpus_scores  # pylint: disable=import-outside-toplevel
  out = {}
  for name, (score, signature) in corpus_scores(hypotheses, references).items():
    out[name], out[f'{name}_signature'] = round(float(score.score), 4), signature
  return out


def _write(path: str, lines: Sequence[str]) -> None:
  from common.atomic_file import atomic_write  # pylint: disable=import-outside-toplevel
  atomic_write(path, ''.join(f'{line}\n' for line in lines).encode())


def split_file(workdir: str, split: str, what: str) -> str:
  """`what`: 'hyp' (the run's outputs) or 'ref' (the references), one line each."""
  return os.path.join(workdir, EVAL_DIR, f'{split}.{what}')


def evaluate(workdir: str, decode: Mapping[str, Any], *, translates: bool,
             sentences: int | None = None, metric: str = 'bleu') -> dict[str, Any]:
  """Evaluates the trained run in `workdir` (holding its lock) -> the results, also written to
  results.json. `sentences`: the first N of each split (None: all); `metric`: what chooses
  among a grid of decoding settings, on validation."""
  from workdir import train_lock  # pylint: disable=import-outside-toplevel
  started = time.perf_counter()
  lock = train_lock.acquire(workdir)
  try:
    os.makedirs(os.path.join(workdir, EVAL_DIR), exist_ok=True)
    found = (_translation(workdir, decode, sentences, metric) if translates
             else _language_model(workdir))
    found['eval_wall_s'] = round(time.perf_counter() - started, 1)
    from common import interrupts  # pylint: disable=import-outside-toplevel
    interrupts.check()  # a stop that Python dropped (a gc callback): no results.json
    from common.atomic_file import atomic_write  # pylint: disable=import-outside-toplevel
    atomic_write(results_path(workdir),
                 (json.dumps(found, indent=2, sort_keys=True) + '\n').encode())
  finally:
    lock.release()
  return found


def _translation(workdir: str, decode: Mapping[str, Any], sentences: int | None, metric: str
                 ) -> dict[str, Any]:
  from input_pipeline import sources  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  from workdir.config_io import load_config  # pylint: disable=import-outside-toplevel
  kept = max(len(checkpoint.list_steps(workdir)), 1)
  data = load_config(workdir).data
  names = dict(zip(SPLITS, (data.eval_split, data.test_split), strict=True))
  splits = {split: sources.split_texts(data, name)[:sentences] for split, name in names.items()}
  sessions: dict[int, Any] = {}  # average_last -> the restored model
  warnings: list[str] = []

  def session(average: int):
    if average not in sessions:
      import inference  # pylint: disable=import-outside-toplevel
      sessions.clear()  # one model in memory at a time
      sessions[average] = inference.load(workdir, average_last=average, warn=warnings.append)
    return sessions[average]

  out: dict[str, Any] = {'eval_sentences': sentences}
  points = grid_points(decode)
  chosen, decoded = points[0], {}  # decoded: split -> `_decode_split` of the chosen setting
  if len(points) > 1:  # each point on validation; the best one decodes test, once
    grid, outputs = [], []
    for point in points:
      point = {**point, AVERAGE_LAST: min(int(point.get(AVERAGE_LAST, 1)), kept)}
      outputs.append(_decode_split(session(point[AVERAGE_LAST]), point, splits['validation']))
      grid.append({'decode': point, metric: outputs[-1][metric]})
    best = max(range(len(grid)), key=lambda i: (grid[i][metric], -i))  # ties: the first
    chosen, decoded['validation'] = grid[best]['decode'], outputs[best]
    out['decode_grid'] = {'choices': _as_json(decode), 'metric': metric, 'points': grid}
  average = min(int(chosen.get(AVERAGE_LAST, 1)), kept)
  settings = {k: v for k, v in chosen.items() if k != AVERAGE_LAST}
  restored = session(average)
  out.update({'step': restored.step, 'parameters': _parameters(restored.module),
              'decode': {**settings, AVERAGE_LAST: average},
              'search': restored.settings(**settings)[0].describe()})
  for split, examples in splits.items():
    found = decoded.get(split) or _decode_split(restored, chosen, examples)
    _write(split_file(workdir, split, 'hyp'), found.pop('hypotheses'))
    _write(split_file(workdir, split, 'ref'), [e['target'] for e in examples])
    out[split] = {'split': names[split], **found}
  out['warnings'] = sorted(set(warnings))[:5]
  return out


def _as_json(decode: Mapping[str, Any]) -> dict[str, Any]:
  return json.loads(json.dumps(dict(decode)))  # tuples as lists, as results.json reads back


def _decode_split(session, point: Mapping[str, Any], examples) -> dict[str, Any]:
  """The split's hypotheses with the setting `point` (its average_last is the session's) and
  their scores, empty and cut lines, and the decoding's wall time."""
  from autoregressive.strategies.base import stopped_at_limit  # pylint: disable=import-outside-toplevel
  settings = {k: v for k, v in point.items() if k != AVERAGE_LAST}
  limits = session.settings(**settings)[1]
  started = time.perf_counter()
  found = session.hypotheses([e['source'] for e in examples], **settings)
  hypotheses = [h[0].text if h else '' for h in found]
  return {'hypotheses': hypotheses, 'sentences': len(examples),
          'empty': sum(not h.strip() for h in hypotheses),
          # stopped at max_new_tokens without EOS, as decode.py counts them
          'cut': sum(bool(h) and stopped_at_limit(h[0].tokens, limits.max_new_tokens,
                                                  session.tokenizer.eos_id) for h in found),
          'decode_wall_s': round(time.perf_counter() - started, 1),
          **scores(hypotheses, [e['target'] for e in examples])}


def _parameters(module) -> int:
  """The parameter count of a module, concrete or abstract (shapes only)."""
  import math  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param))))


def _language_model(workdir: str) -> dict[str, Any]:
  """The trainer's last validation figures, read from the run's events."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  from workdir.restore import read_model  # pylint: disable=import-outside-toplevel
  run = report.load_run(workdir)
  losses = run.scalars.get('eval/loss', [])
  if not losses:
    raise RuntimeError(f'{workdir}: no validation loss in its events (config.train.'
                       'eval_every_steps?)')
  last = losses[-1]
  out = {'step': last.step, 'parameters': _parameters(read_model(workdir)[1]),
         'validation': {'loss': round(last.value, 6)}}
  perplexity = run.scalars.get('eval/perplexity', [])
  if perplexity:
    out['validation']['perplexity'] = round(perplexity[-1].value, 4)
  return out
