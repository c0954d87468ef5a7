"""train.py's command line: overrides, one-line errors, and one end-to-end run on the real data."""

import json
import os
import subprocess
import sys

import jax
import mains
import numpy as np
import pytest
import test_train_synthetic as syn

TRAIN = os.path.join(syn.REPO, 'train.py')


def _train(*args, timeout=300):
  return subprocess.run([sys.executable, TRAIN, *args], env=syn.subprocess_env(1), cwd=syn.REPO,
                        capture_output=True, text=True, timeout=timeout)


BAD_CONFIGS = [
    (['--config.model.num_headz=2'],
     'unknown config field --config.model.num_headz; did you mean config.model.num_heads?'),
    (['--config.trian.num_steps=2'], 'unknown config field --config.trian.num_steps'),
    (['--config.train.num_steps=abc'], "--config.train.num_steps=abc: invalid literal for int()"),
    (['--config.optimizer.name=sgd'], "config.optimizer.name='sgd' is not one of"),
    (['--config.model.d_model=30'], 'config.model.d_model=30 is not divisible by'),
    (['--config.optimizer.learning_rate=inf'],
     'config.optimizer.learning_rate=inf must be a finite number'),
    (['--config=configs/default.py:huge'], "unknown preset 'huge'"),
    (['--config=configs/nope.py'], "config file 'configs/nope.py' not found"),
    (['--config.mesh.tensor=2'], 'config.mesh (data, fsdp, tensor)=(-1, 1, 2): 1 devices are '
                                 'not divisible by 2'),
    (['--config.mesh.fsdp=0'], 'config.mesh.fsdp=0 must be a positive integer or -1'),
    (['--config.mesh.rules.embed=model'],
     "config.mesh.rules.embed='model': ['model'] are not mesh axes"),
]
# Also run as processes of their own (exit status, nothing else on stderr): a bad literal
# (absl's parser) and a mesh the devices do not divide (JAX started).
OWN_PROCESS = ('--config.train.num_steps=abc', '--config.mesh.tensor=2')


@pytest.fixture(scope='module')
def refusals(tmp_path_factory) -> dict:
  """BAD_CONFIGS' command lines, all in one interpreter (`mains`), and those of
  OWN_PROCESS as their own processes too: args[0] -> (workdir, [(exit status, stdout,
  stderr)...])."""
  root = tmp_path_factory.mktemp('refusals')
  workdirs = {args[0]: str(root / f'w{i}') for i, (args, _) in enumerate(BAD_CONFIGS)}
  runs = {name: ['--config=configs/default.py:tiny', f'--workdir={workdirs[name]}', name]
          for name in workdirs}
  found = {name: (workdirs[name], [result]) for name, result in
           zip(runs, mains.run_mains(list(runs.values()), 'train.py', devices=1), strict=True)}
  for name in OWN_PROCESS:
    proc = _train(*runs[name])
    found[name][1].append((proc.returncode, proc.stdout, proc.stderr))
  return found


@pytest.mark.parametrize('args,message', BAD_CONFIGS)
def test_bad_config_is_one_line_before_anything_runs(refusals, args, message):
  workdir, results = refusals[args[0]]
  assert len(results) == (2 if args[0] in OWN_PROCESS else 1)
  for code, out, err in results:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith('train.py: error: ') and message in lines[0], lines[0]
    assert 'Traceback' not in out + err
  assert not os.path.exists(workdir)


def test_dry_run_prints_the_memory_table_and_writes_nothing(tmp_path):
  """--config.train.dry_run=True compiles the step for the mesh and exits: no data, no workdir."""
  proc = _train('--config=configs/default.py:tiny', '--config.train.dry_run=True',
                '--config.train.batch_size=8')
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert 'parameters; train step compiled in' in lines[-2]
  assert lines[-1].startswith('per-device memory on mesh (data x fsdp x tensor) 1x1x1: params ')
  assert 'temporaries' in lines[-1] and 'total' in lines[-1]


def test_show_config_prints_values_origins_and_docs_and_touches_no_workdir(tmp_path):
  """--show_config: a row per field (value, origin, doc), then exit 0; --workdir is not needed
  and, given, not created. The origins' rules: tests/test_config_schema.py."""
  workdir = tmp_path / 'never-created'
  proc = _train('--config=configs/default.py:tiny', '--config.train.num_steps=9',
                f'--workdir={workdir}', '--show_config')
  assert proc.returncode == 0 and proc.stderr == '', proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert lines[0] == 'config: configs/default.py:tiny' and lines[1].startswith('origin: ')
  header = lines[3]
  cut = [header.index(word) for word in ('value', 'origin', 'doc')]
  rows = {line[:cut[0]].strip(): (line[cut[0]:cut[1]].strip(), line[cut[1]:cut[2]].strip(),
                                  line[cut[2]:]) for line in lines[4:] if line}
  assert rows['train.num_steps'] == ('9', 'override', 'optimizer updates of the run')
  assert rows['train.batch_size'][:2] == ('16', 'preset')
  assert rows['train.seed'][:2] == ('0', 'default')
  assert rows['data.data_dir'][:2] == ('None', 'default')
  assert all(doc for _, _, doc in rows.values())
  assert not workdir.exists()


def test_workdir_is_required():
  proc = _train('--config=configs/default.py:tiny')
  assert proc.returncode == 2
  assert proc.stderr.strip() == 'train.py: error: --workdir is required'


def test_end_to_end_tiny_run_with_overrides_and_resume(tmp_path):
  """The real input pipeline (bundled Multi30k), BLEU, outputs in DIR, then a resume."""
  workdir = str(tmp_path)
  args = ['--config=configs/default.py:tiny', f'--workdir={workdir}',
          '--config.train.num_steps=4', '--config.train.eval_every_steps=4',
          '--config.train.log_every_steps=2', '--config.train.checkpoint_every_steps=2',
          '--config.model.num_heads=2', '--config.model.vocab_size=512',
          '--config.data.vocab_size=512', '--config.decode.num_eval_sentences=8']
  proc = _train(*args)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = proc.stdout
  assert 'parameters' in out and 'mesh (data=1, fsdp=1, tensor=1)' in out
  assert 'per-device memory on mesh (data x fsdp x tensor) 1x1x1: params ' in out
  assert 'step 4/4 | loss ' in out and 'tok/s' in out and 'ETA' in out
  assert 'BLEU' in out and 'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:' in out
  assert out.strip().splitlines()[-1].startswith('done: step 4/4')
  assert 'best BLEU' in out.strip().splitlines()[-1]
  # bench/gpu_targets.py reads the best validation loss from this line (issue 16's target).
  from bench import gpu_targets  # pylint: disable=import-outside-toplevel
  loss = gpu_targets.best_val_loss(out)
  assert loss is not None and f'best val loss {loss:.4f} (step 4)' in out
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  assert config['model']['num_heads'] == 2 and config['train']['num_steps'] == 4
  names = os.listdir(workdir)
  assert 'checkpoints' in names and 'tokenizer' in names
  assert any(n.startswith('events.out.tfevents') for n in names)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4']

  # Again with more steps: resumes at 4, reports the changed field.
  proc = _train(*args[:2], '--config.train.num_steps=6', *args[3:-1],
                '--config.decode.num_eval_sentences=0')
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert 'resumed from the checkpoint at step 4' in proc.stdout
  assert 'train.num_steps: 4 -> 6' in proc.stdout
  assert 'step 6/6' in proc.stdout and 'step 2/' not in proc.stdout
  # ... exactly: its step 6 is bitwise a straight 6-step run's, through train.py and the real
  # data pipeline (the schedule does not read num_steps), on any machine and without root.
  straight = str(tmp_path.parent / f'{tmp_path.name}_straight')  # beside the workdir
  proc = _train(args[0], f'--workdir={straight}', '--config.train.num_steps=6', *args[3:-1],
                '--config.decode.num_eval_sentences=0')
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  from training import checkpoint  # pylint: disable=import-outside-toplevel
  (resumed, step), (once, step_once) = (checkpoint.restore_params(w) for w in (workdir, straight))
  assert step == step_once == 6
  for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(once), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_change_of_the_state_layout_is_refused_and_config_json_kept(workdirs, tmp_path):
  """Issue 58, cause 2: a field that changes the train state's tree but was not on the hand-made
  list (final_logits_bias adds a bias, optimizer.name another state) rewrote config.json before
  the refusal, and decode.py then refused the workdir. The fields are found by building both
  states abstractly; nothing is written."""
  import shutil  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / 'mt')
  shutil.copytree(workdirs['mt'], workdir)
  with open(os.path.join(workdir, 'config.json'), 'rb') as f:
    before = f.read()
  base = ['--config=configs/default.py:tiny', f'--workdir={workdir}']
  runs = [[*base, '--config.model.final_logits_bias=True'],
          [*base, '--config.optimizer.name=muon'], [*base, '--config.model.embedding_norm=True'],
          [*base, '--config.model.d_model=64']]  # a shape, as the hand-made list had
  for (code, _, err), field in zip(mains.run_mains(runs, 'train.py', devices=1),
                                   ('model.final_logits_bias=False (new True)',
                                    "optimizer.name='adam' (new 'muon')",
                                    'model.embedding_norm=False (new True)',
                                    'model.d_model=32 (new 64)'), strict=True):
    assert code == 2 and f'holds a run with a different model/data setup: {field};' in err, err
    with open(os.path.join(workdir, 'config.json'), 'rb') as f:
      assert f.read() == before


def test_a_fine_tune_resumes_without_its_init_from_directory(workdirs, tmp_path):
  """Issue 58, cause 11: once a fine-tune has a checkpoint, its own config.json and
  checkpoints are enough to resume; the init_from directory may be gone."""
  import shutil  # pylint: disable=import-outside-toplevel
  source, workdir = str(tmp_path / 'source'), str(tmp_path / 'ft')
  shutil.copytree(workdirs['mt'], source)
  args = ['--config=configs/default.py:tiny', f'--workdir={workdir}',
          f'--config.train.init_from={source}', '--config.decode.num_eval_sentences=0',
          '--config.train.num_eval_batches=1', '--config.train.checkpoint_every_steps=2']
  (code, out, err), = mains.run_mains([[*args, '--config.train.num_steps=2']], 'train.py',
                                      devices=1)
  assert code == 0, err
  shutil.rmtree(source)
  (code, out, err), = mains.run_mains([[*args, '--config.train.num_steps=4']], 'train.py',
                                      devices=1)
  assert code == 0, err
  assert 'resumed from the checkpoint at step 2' in out + err
  assert 'done: step 4/4' in out + err
