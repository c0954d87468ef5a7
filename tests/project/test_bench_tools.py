"""bench/'s tools: gpu_targets.py's subprocess runner (what a stopped device call's log still
holds) and sweep_step.py's rows (each row's config as train.py resolves it)."""

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
