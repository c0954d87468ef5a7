"""bench/'s tools: gpu_targets.py's subprocess runner (what a stopped device call's log still
holds) and sweep_step.py's rows (each row's config as train.py resolves it)."""

import json
import os
import subprocess
import sys

import pytest

from bench import gpu_targets

_CHILD = ('import sys, time\n'
          'print("{\\"a\\": 1}", flush=True)\n'
          'print("progress line", file=sys.stderr, flush=True)\n'
          'print("not json")\n'
          'sys.exit(int(sys.argv[1]))\n')


def test_run_echoes_output_and_returns_json_lines(capfd):
  lines, wall, error = gpu_targets.run([sys.executable, '-c', _CHILD, '0'], timeout=60)
  assert lines == [{'a': 1}] and error == '' and wall > 0
  echoed = capfd.readouterr().err
  assert '{"a": 1}' in echoed and 'progress line' in echoed and 'not json' in echoed


def test_run_text_returns_the_stderr_tail_of_a_failure():
  stdout, _, error = gpu_targets.run_text([sys.executable, '-c', _CHILD, '3'], timeout=60)
  assert stdout.splitlines() == ['{"a": 1}', 'not json']
  assert error.strip() == 'progress line'


def test_run_text_kills_the_command_at_its_timeout(capfd, tmp_path):
  pid_file = tmp_path / 'pid'
  child = (f'import os, time; open({str(pid_file)!r}, "w").write(str(os.getpid())); '
           'print("started", flush=True); time.sleep(10**6)')
  # It prints within ~0.1 s; a machine too loaded to start it in 2 s gets a longer limit, and
  # so on (the child must have started for its output and its end to be checked).
  limit = 2
  while True:
    with pytest.raises(subprocess.TimeoutExpired):
      gpu_targets.run_text([sys.executable, '-c', child], timeout=limit)
    if pid_file.exists():
      break
    limit *= 10
  with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
    os.kill(int(pid_file.read_text()), 0)
  assert 'started' in capfd.readouterr().err  # what it printed before the limit is in the log


def test_sweep_step_times_each_rows_own_config():
  """bench/sweep_step.py builds each row's step from the config train.py would run (the
  row's overrides on the sweep's config) and a batch of the pipeline's packed layout."""
  from bench import sweep_step
  from model.kinds import adapter_of
  from training import config_check
  configs, baseline = sweep_step.row_configs('configs/sweeps/ladder_multi30k.py')
  assert baseline == 'baseline'
  plan = {row: (c.optimizer.name, c.optimizer.schedule, c.model.zero_init_out,
                c.model.activation, c.model.d_ff, c.model.norm_position, c.train.num_steps)
          for row, c in configs.items()}
  assert plan == {  # each rung keeps the ones before it
      'baseline': ('adam', 'rsqrt', False, 'relu', 256, 'post', 1500),
      'muon': ('muon', 'rsqrt', False, 'relu', 256, 'post', 1500),
      'muon+wsd': ('muon', 'wsd', False, 'relu', 256, 'post', 1500),
      'muon+wsd+zero_init_out': ('muon', 'wsd', True, 'relu', 256, 'post', 1500),
      'muon+wsd+zero_init_out+swiglu': ('muon', 'wsd', True, 'swiglu', 170, 'post', 1500),
      'muon+wsd+zero_init_out+swiglu+pre_ln': ('muon', 'wsd', True, 'swiglu', 170, 'pre', 1500)}
  config = configs['baseline']
  model_config = config_check.validate_config(config, num_devices=1)
  batch = sweep_step.batch_of(config, model_config)
  shapes = adapter_of(model_config).train_batch_shapes(config.train.batch_size,
                                                        config.data.max_length, True)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == shapes
  assert int(batch['targets'].min()) >= 3 and int(batch['targets'].max()) < config.model.vocab_size
  assert list(batch['inputs_position'][0]) == list(range(batch['inputs'].shape[1]))


def test_startup_times_a_command_and_names_one_that_fails():
  """bench/startup.py: a command's CPU and wall seconds; a failing one ends the bench naming
  the command and its last error line (a figure of a failed start would mean nothing)."""
  from bench import startup
  cpu, wall = startup.timed(sys.executable, ['-c', 'sum(range(10**6))'])
  assert cpu > 0 and wall > 0
  with pytest.raises(SystemExit, match=r"-c import nothing_here exited 1: .*No module named"):
    startup.timed(sys.executable, ['-c', 'import nothing_here'])


def test_time_to_quality_crossings_and_training_minutes():
  """bench/time_to_quality.py: a threshold's minutes interpolate between the checkpoints
  around it ('by' the first when already there, 'never' when not reached), and a step's
  minutes leave out the evaluations and saves before it."""
  from bench import time_to_quality as ttq
  from experiments.report import Point
  points = [(10.0, 30.0), (20.0, 38.0), (30.0, 40.0)]
  assert ttq.crossing(points, 39.0) == {'minutes': 25.0, 'how': 'interpolated'}
  assert ttq.crossing(points, 29.0) == {'minutes': 10.0, 'how': 'by'}
  assert ttq.crossing(points, 41.0) == {'minutes': None, 'how': 'never'}
  scalars = {'train/step_ms': [Point(50, 1.0, 0.0), Point(100, 3.0, 0.0), Point(150, 6.0, 0.0)],
             'eval/seconds': [Point(100, 3.5, 30.0), Point(150, 7.0, 60.0)],
             'checkpoint/seconds': [Point(50, 1.1, 6.0)]}
  assert ttq.training_minutes(scalars, 100) == pytest.approx(3.0 - 0.1)  # the save at 50
  assert ttq.training_minutes(scalars, 125) == pytest.approx(4.5 - 0.1 - 0.5)  # + the eval at 100
  with pytest.raises(ValueError, match='no training log at or before step 10'):
    ttq.training_minutes(scalars, 10)
  assert ttq.recipe_of('/r/sweep/modern_b64/seed_2/') == 'modern_b64'
  assert ttq.recipe_of('/r/my_run') == 'my_run'
  summary = ttq.summarize({'a': {'recipe': 'x', 'points': [
      {'minutes': m, 'bleu_lowercased': b} for m, b in points]}}, [39.0, 41.0])
  assert summary['x']['39.0']['mean_minutes'] == 25.0
  assert summary['x']['41.0']['mean_minutes'] is None
  assert '| x | 25.0 (1 runs) | never |' in ttq.table(summary, [39.0, 41.0])


def test_time_to_quality_scores_every_kept_checkpoint(workdirs, tmp_path, capsys):
  """End to end on the suite's tiny translation run: one point per kept checkpoint, in step
  and time order, scored on the validation sentences asked for; the JSON and plot written."""
  from bench import time_to_quality as ttq
  from workdir import checkpoint
  found = ttq.main([f'--workdir={workdirs["mt"]}', f'--output_dir={tmp_path}', '--sentences=3',
                    '--beam_size=2', '--max_new_tokens=6', '--thresholds=0,1000'])
  points = found['runs'][workdirs['mt']]['points']
  assert [p['step'] for p in points] == checkpoint.list_steps(workdirs['mt'])
  assert len(points) >= 2 and 0 < points[0]['minutes'] < points[-1]['minutes']
  crossings = found['summary']['mt']
  assert crossings['0.0']['runs'][0]['how'] == 'by'
  assert crossings['1000.0']['runs'][0]['how'] == 'never'
  assert (tmp_path / 'time_to_quality.png').stat().st_size > 0
  assert json.loads((tmp_path / 'time_to_quality.json').read_text())['sentences'] == 3
  # Joined later without the checkpoints (an archive has none): the same runs and table.
  first = tmp_path / 'first.json'
  (tmp_path / 'time_to_quality.json').rename(first)
  again = ttq.main([f'--merge={first}', f'--output_dir={tmp_path / "joined"}', '--sentences=3',
                    '--beam_size=2', '--max_new_tokens=6', '--thresholds=0,1000'])
  assert again['runs'] == found['runs'] and again['summary'] == found['summary']
  capsys.readouterr()
  for args, why in [(['--sentences=4'], 'decoded with sentences=3, this run asks 4'),
                    ([f'--merge={first}'], f'run {workdirs["mt"]} is already in another file'),
                    ([f'--workdir={workdirs["mt"]}'], 'is already in a --merge file')]:
    with pytest.raises(SystemExit) as stopped:  # before any decoding: one line, exit 2
      ttq.main([f'--merge={first}', f'--output_dir={tmp_path / "refused"}', '--beam_size=2',
                '--max_new_tokens=6', *(['--sentences=3'] if '--sentences=4' not in args else []),
                *args])
    assert stopped.value.code == 2 and why in capsys.readouterr().err
  assert not (tmp_path / 'refused').exists()
  with pytest.raises(SystemExit) as stopped:  # not a run: one line, exit 2
    ttq.main([f'--workdir={tmp_path}', f'--output_dir={tmp_path / "out"}'])
  assert stopped.value.code == 2 and not (tmp_path / 'out').exists()
  a_file = tmp_path / 'a_file'  # refused before any checkpoint is decoded
  a_file.write_text('kept\n')
  with pytest.raises(SystemExit) as stopped:
    ttq.main([f'--workdir={tmp_path}', f'--output_dir={a_file / "out"}'])
  assert stopped.value.code == 2 and a_file.read_text() == 'kept\n'
  assert f'{a_file} is not a directory this process can write in' in capsys.readouterr().err


def test_accelerator_check_refuses_an_out_it_cannot_write_before_any_part(tmp_path, monkeypatch,
                                                                          capsys):
  """The GPU session's script: an --out it could not write would have ended a device call's
  parts in a traceback, their JSON lost (it also writes the JSON after each part now)."""
  from bench import accelerator_check
  a_file = tmp_path / 'a_file'
  a_file.write_text('kept\n')
  for out, message in ((tmp_path, 'is a directory'),
                       (a_file / 'result.json', 'cannot create the folder of --out=')):
    monkeypatch.setattr(sys, 'argv', ['accelerator_check.py', f'--out={out}'])
    with pytest.raises(SystemExit) as stopped:
      accelerator_check.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and message in err.splitlines()[-1], err
  assert a_file.read_text() == 'kept\n' and os.listdir(tmp_path) == ['a_file']
