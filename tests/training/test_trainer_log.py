"""What a run says about itself: step time, tokens/s and ETA measure train steps
only, evaluations / checkpoints / compilations get lines and metrics of their own, each
compile wait is announced, the config is echoed against its preset, a typo'd field gets the
close fields, and the best figures survive a resume.

One tiny synthetic run with an evaluation and a checkpoint every 3 steps serves most tests; on
the clock the run reports with, each evaluation takes 1000 s and each checkpoint 500 s more,
so a step time that counted them could not be mistaken for a slow machine.
"""

import contextlib
import io
import json
import os
import re
import shutil

import pytest

from configs import default
from experiments import report
from tests.training import test_train_synthetic as syn
from training import evaluation, metrics, progress, trainer
from workdir import checkpoint as ckpt_lib

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)

EVAL_S, CHECKPOINT_S = 1000.0, 500.0
OVERRIDES = {'train.num_steps': 9, 'train.eval_every_steps': 3,
             'train.checkpoint_every_steps': 3, 'train.log_every_steps': 3,
             'decode.num_eval_sentences': 4, 'decode.beam_size': 2}
PRESET = ('configs/default.py:tiny', default.get_config('tiny'))


def _train(workdir, overrides=OVERRIDES):
  config = syn.tiny_config('encoder_decoder', **overrides)
  return trainer.train_and_evaluate(config, workdir, datasets=syn.SyntheticDatasets(config),
                                    preset=PRESET)


@pytest.fixture(scope='module')
def logged(tmp_path_factory):
  """-> (workdir, console lines, summary) of the 9-step run with slow evaluations and
  checkpoints."""
  workdir = str(tmp_path_factory.mktemp('logged'))
  shift = [0.0]
  clock, evaluate, save = metrics.now, evaluation.evaluate, ckpt_lib.Checkpointer.save

  def slow_evaluate(*args, **kwargs):
    shift[0] += EVAL_S
    return evaluate(*args, **kwargs)

  def slow_save(self, *args, **kwargs):
    shift[0] += CHECKPOINT_S
    return save(self, *args, **kwargs)

  out = io.StringIO()
  with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
    mp.setattr(metrics, 'now', lambda: clock() + shift[0])
    mp.setattr(evaluation, 'evaluate', slow_evaluate)
    mp.setattr(ckpt_lib.Checkpointer, 'save', slow_save)
    summary = _train(workdir)
  return workdir, out.getvalue().splitlines(), summary


def _line(lines, prefix):
  found = [line for line in lines if line.startswith(prefix)]
  assert len(found) == 1, (prefix, lines)
  return found[0]


def _seconds(hms: str) -> int:
  h, m, s = (int(x) for x in hms.split(':'))
  return 3600 * h + 60 * m + s


def test_step_time_and_eta_leave_out_evaluations_and_checkpoints(logged):
  workdir, lines, summary = logged
  after_eval = _line(lines, 'step 6/9 |')  # steps 4-6, after the evaluation and checkpoint at 3
  step_ms = float(re.search(r'([\d.]+) ms/step', after_eval).group(1))
  assert step_ms < 100_000, after_eval  # counting them would give >= 500,000 ms per step
  # ETA = 3 steps + the evaluation and the checkpoint still to come (at step 9) at their pace:
  # counted once (twice would be >= 2 x 1500 s; the real seconds of any machine are far fewer).
  eta = _seconds(re.search(r'ETA (\d+:\d\d:\d\d)', after_eval).group(1))
  assert EVAL_S + CHECKPOINT_S <= eta < 2 * (EVAL_S + CHECKPOINT_S), after_eval
  run = report.load_run(workdir)
  assert [p.step for p in run.scalars['eval/seconds']] == [3, 6, 9]
  assert all(p.value >= EVAL_S for p in run.scalars['eval/seconds'])
  assert [p.step for p in run.scalars['checkpoint/seconds']] == [3, 6, 9]
  assert all(p.value >= CHECKPOINT_S for p in run.scalars['checkpoint/seconds'])
  assert all(p.value < 100_000 for p in run.scalars['train/step_ms'])
  assert [p.step for p in run.scalars['compile/train_step_seconds']] == [1]
  assert [p.step for p in run.scalars['compile/eval_seconds']] == [3]  # only the first compiles
  for step in (3, 6, 9):
    eval_line = _line(lines, f'eval step {step} ')
    # The simulated seconds plus the real ones (under 1000 s and 100 s on any machine).
    assert re.search(rf'^eval step {step} \|.* \| 1\d\d\d\.\ds', eval_line), eval_line
    saved = _line(lines, f'checkpoint step {step} ')
    assert re.fullmatch(rf'checkpoint step {step} \| 5\d\d\.\ds', saved), saved
  assert summary['seconds_outside_train_steps']['eval'] >= 3 * EVAL_S
  # Compilation shows once it reaches a second: a warm compilation cache on a fast machine
  # compiles this tiny model in less, and the part is then left out.
  compiled = (r', compilation \d+:\d\d:\d\d'
              if summary['seconds_outside_train_steps'].get('compile', 0) >= 1 else '')
  assert re.search(r'^done: step 9/9 in .* \(evaluation 0:5\d:\d\d, checkpoints 0:2\d:\d\d'
                   rf'{compiled}\)', lines[-1]), lines[-1]


def test_each_compile_wait_is_announced_then_timed(logged):
  _, lines, _ = logged
  order = [_line(lines, 'compiling the train step ...'),
           _line(lines, 'compiled the train step in '),
           _line(lines, 'step 3/9 |'),
           _line(lines, 'compiling the evaluation step ...'),
           _line(lines, 'compiled the evaluation step in '),
           _line(lines, 'compiling beam search for evaluation ...'),
           _line(lines, 'compiled beam search for evaluation in '),
           _line(lines, 'eval step 3 |')]
  assert [lines.index(line) for line in order] == sorted(lines.index(line) for line in order)
  assert re.search(r' \(compiling \d+\.\ds\)$', order[-1]), order[-1]
  assert '(compiling' not in _line(lines, 'eval step 6 |')  # compiled once


def test_the_config_is_echoed_against_its_preset(logged):
  workdir, lines, _ = logged
  first = lines[0]
  assert first.startswith('config: configs/default.py:tiny | '), first
  for change in ('train.num_steps=9 (preset: 20)', 'model.vocab_size=32 (preset: 512)',
                 'decode.num_eval_sentences=4 (preset: 16)', 'train.batch_size=8 (preset: 16)'):
    assert f'| {change}' in first, (change, first)
  assert 'model.d_model' not in first  # 32 in both
  text = report.load_run(workdir).texts['config']
  assert 'configs/default.py:tiny' in text and 'train.num_steps=9 (preset: 20)' in text
  assert '"num_steps": 9' in text  # and the whole resolved config


def test_did_you_mean_ranks_by_the_last_component():
  from configs import resolve  # pylint: disable=import-outside-toplevel

  def message(field):
    with pytest.raises(resolve.UnknownField) as caught:
      resolve.resolve('configs/default.py:tiny', {field: 2})
    return str(caught.value)

  found = message('model.num_layers')
  assert found.startswith("unknown config field 'model.num_layers'; did you mean ")
  assert 'config.model.num_encoder_layers' in found
  assert 'config.model.num_decoder_layers' in found
  assert 'scan_layers' not in found
  assert message('trian.num_steps') == (
      "unknown config field 'trian.num_steps'; did you mean config.train.num_steps?")


def test_best_figures_survive_a_resume(logged, tmp_path):
  workdir, _, summary = logged
  path = os.path.join(workdir, progress.BEST_FILE)
  with open(path) as f:
    best = json.load(f)
  assert best['loss'] == {'value': summary['best_eval_loss'],
                          'step': summary['best_eval_loss_step']}
  assert best['bleu']['step'] == summary['best_bleu_step']
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(workdir, resumed)
  # An earlier evaluation better than any to come, and one from a step after the checkpoint
  # (a run killed between them): the second is dropped, as the resumed run redoes that step.
  with open(os.path.join(resumed, progress.BEST_FILE), 'w') as f:
    json.dump({'loss': {'value': 0.001, 'step': 3}, 'bleu': {'value': 99.0, 'step': 12}}, f)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    summary = _train(resumed, {**OVERRIDES, 'train.num_steps': 12})
  assert 'resumed from the checkpoint at step 9' in out.getvalue()
  assert (summary['best_eval_loss'], summary['best_eval_loss_step']) == (0.001, 3)
  assert summary['best_bleu_step'] == 12 and summary['best_bleu'] < 99
  assert '| best val loss 0.0010 (step 3) |' in out.getvalue().splitlines()[-1]
  with open(os.path.join(resumed, progress.BEST_FILE)) as f:
    assert json.load(f)['loss'] == {'value': 0.001, 'step': 3}


def test_a_damaged_best_file_is_ignored_with_a_warning(tmp_path, capsys):
  best = progress.BestMetrics(str(tmp_path))
  (tmp_path / progress.BEST_FILE).write_text('{"loss": [')
  best.load(resumed_step=10)
  assert best.get('loss') == (None, None)
  assert 'WARNING: ignoring' in capsys.readouterr().err
  assert best.update('loss', 2.5, 12) and not best.update('loss', 3.0, 14)
  assert json.loads((tmp_path / progress.BEST_FILE).read_text()) == {
      'loss': {'value': 2.5, 'step': 12}}
  best.load(resumed_step=0)  # a fresh start counts nothing from before
  assert best.get('loss') == (None, None)
