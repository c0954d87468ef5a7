"""train.py's command line: overrides, one-line errors, and one end-to-end run on the real data.

The file's command lines run in two interpreters (`mains`: a process each spent ~2 s on
start-up, 9 of them): the first runs the refusals, --show_config, a dry run, the first part of
the end-to-end run and its uninterrupted twin, and a fine-tune's first steps; the second, a
fresh interpreter that knows the runs only from their workdirs, the resumes. Two refusals run
as processes of their own too (OWN_PROCESS)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests import mains
from tests.training import test_train_synthetic as syn

TRAIN = os.path.join(syn.REPO, 'train.py')


def _train(*args):
  return subprocess.run([sys.executable, TRAIN, *args], env=syn.subprocess_env(1), cwd=syn.REPO,
                        capture_output=True, text=True)


BAD_CONFIGS = [
    (['--config.model.num_headz=2'],
     'unknown config field --config.model.num_headz; did you mean config.model.num_heads?'),
    (['--config.train.num_steps=abc'], "--config.train.num_steps=abc: invalid literal for int()"),
    (['--config.optimizer.learning_rate=inf'],
     'config.optimizer.learning_rate=inf must be a finite number'),
    (['--config=configs/default.py:huge'], "unknown preset 'huge'"),
    (['--config=configs/nope.py'], "config file 'configs/nope.py' not found"),
    (['--config.mesh.tensor=2'], 'config.mesh (data, fsdp, tensor)=(-1, 1, 2): 1 devices are '
                                 'not divisible by 2'),
    (['--config.mesh.rules.embed=model'],
     "config.mesh.rules.embed='model': ['model'] are not mesh axes"),
    # train.py's own int flags, C ints in jax.distributed (issue 27 item 6)
    (['--num_processes=99999999999999999999'],
     '--num_processes=99999999999999999999 must be an integer in [1, 2147483647]'),
    (['--process_id=-1'], '--process_id=-1 must be an integer in [0, 2147483646]'),
]
# Refusals whose message is checked in-process, and whose way through train.py is one of the
# above's (a config's value: learning_rate=inf's), are not repeated here: a misspelt section
# (`--config.trian.num_steps`: test_trainer_log's test_did_you_mean_ranks_by_the_last_component),
# `optimizer.name=sgd` (test_config_schema, test_train_unit), `model.d_model=30` (test_model),
# `mesh.fsdp=0` (test_config_schema), `learning_rate=1e308` (test_config_ranges).
# Also run as processes of their own (exit status, nothing else on stderr): a bad literal
# (absl's parser) and a mesh the devices do not divide (JAX started).
OWN_PROCESS = ('--config.train.num_steps=abc', '--config.mesh.tensor=2')


E2E = ['--config=configs/default.py:tiny', '--config.train.eval_every_steps=4',
       '--config.train.log_every_steps=2', '--config.train.checkpoint_every_steps=2',
       '--config.model.num_heads=2', '--config.model.vocab_size=512',
       '--config.data.vocab_size=512']
# Changes of the train state's layout (issue 58, cause 2) and the field each one names.
LAYOUTS = [('--config.model.final_logits_bias=True', 'model.final_logits_bias=False (new True)'),
           ('--config.optimizer.name=muon', "optimizer.name='adam' (new 'muon')"),
           ('--config.model.embedding_norm=True', 'model.embedding_norm=False (new True)'),
           ('--config.model.d_model=64', 'model.d_model=32 (new 64)')]  # a shape, as before

# init_from with a model field that adds parameters the source lacks, and what each adds.
ADDS = [('--config.model.final_logits_bias=True', 'adds decoder/logits_bias, which'),
        ('--config.model.embedding_norm=True', 'adds decoder/embedding_norm/bias, ')]


@pytest.fixture(scope='module')
def runs(workdirs, tmp_path_factory) -> dict:
  """The command lines of the tests below, in two interpreters (the module's docstring):
  name -> (exit status, stdout, stderr), BAD_CONFIGS' under their args[0] as [one per
  interpreter or process]; and 'dirs': name -> path."""
  import shutil  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp('train_cli')
  dirs = {'e2e': str(root / 'e2e'), 'straight': str(root / 'straight'),
          'never_created': str(root / 'never-created'), 'layout': str(root / 'layout'),
          'source': str(root / 'source'), 'fine_tune': str(root / 'ft')}
  refused = {args[0]: str(root / f'refused{i}') for i, (args, _) in enumerate(BAD_CONFIGS)}
  shutil.copytree(workdirs['mt'], dirs['layout'])
  dirs['a_file'] = str(root / 'a_file')
  with open(dirs['a_file'], 'w') as f:
    f.write('not a workdir\n')
  shutil.copytree(workdirs['mt'], dirs['source'])
  with open(os.path.join(dirs['layout'], 'config.json'), 'rb') as f:
    dirs['layout_config'] = f.read()
  tiny = '--config=configs/default.py:tiny'
  fine_tune = [tiny, f'--workdir={dirs["fine_tune"]}', f'--config.train.init_from={dirs["source"]}',
               '--config.decode.num_eval_sentences=0', '--config.train.num_eval_batches=1',
               '--config.train.checkpoint_every_steps=2']
  first = {
      **{name: [tiny, f'--workdir={workdir}', name] for name, workdir in refused.items()},
      'no_workdir': [tiny],
      **{('not_a_dir', where): [tiny, f'--workdir={path}'] for where, path in (
          ('file', dirs['a_file']), ('under_a_file', os.path.join(dirs['a_file'], 'sub')))},
      'show_config': [tiny, '--config.train.num_steps=9', f'--workdir={dirs["never_created"]}',
                      '--show_config'],
      'dry_run': [tiny, '--config.train.dry_run=True', '--config.train.batch_size=8'],
      **{('layout', flag): [tiny, f'--workdir={dirs["layout"]}', flag] for flag, _ in LAYOUTS},
      'e2e': [*E2E, f'--workdir={dirs["e2e"]}', '--config.train.num_steps=4',
              '--config.decode.num_eval_sentences=8'],
      'straight': [*E2E, f'--workdir={dirs["straight"]}', '--config.train.num_steps=6',
                   '--config.decode.num_eval_sentences=0'],
      'fine_tune': [*fine_tune, '--config.train.num_steps=2'],
      **{('adds', flag): [tiny, f'--workdir={root / "adds"}', fine_tune[2], flag]
         for flag, _ in ADDS},
  }
  found = dict(zip(first, mains.run_mains(list(first.values()), 'train.py', devices=1),
                   strict=True))
  shutil.rmtree(dirs['source'])
  then = {'resumed': [*E2E, f'--workdir={dirs["e2e"]}', '--config.train.num_steps=6',
                      '--config.decode.num_eval_sentences=0'],
          'fine_tune_resumed': [*fine_tune, '--config.train.num_steps=4']}
  found.update(zip(then, mains.run_mains(list(then.values()), 'train.py', devices=1),
                   strict=True))
  for name in refused:
    found[name] = [found[name]]
  for name in OWN_PROCESS:
    proc = _train(*first[name])
    found[name].append((proc.returncode, proc.stdout, proc.stderr))
  found['dirs'] = {**dirs, 'refused': refused, 'adds': str(root / 'adds')}
  return found


@pytest.mark.parametrize('args,message', BAD_CONFIGS)
def test_bad_config_is_one_line_before_anything_runs(runs, args, message):
  results = runs[args[0]]
  assert len(results) == (2 if args[0] in OWN_PROCESS else 1)
  for code, out, err in results:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith('train.py: error: ') and message in lines[0], lines[0]
    assert 'Traceback' not in out + err
  assert not os.path.exists(runs['dirs']['refused'][args[0]])


def test_dry_run_prints_the_memory_table_and_writes_nothing(runs):
  """--config.train.dry_run=True compiles the step for the mesh and exits: no data, no workdir."""
  code, out, err = runs['dry_run']
  assert code == 0, err[-3000:]
  lines = out.strip().splitlines()
  assert 'parameters; train step compiled in' in lines[-2]
  assert lines[-1].startswith('per-device memory on mesh (data x fsdp x tensor) 1x1x1: params ')
  assert 'temporaries' in lines[-1] and 'total' in lines[-1]


def test_show_config_prints_values_origins_and_docs_and_touches_no_workdir(runs):
  """--show_config: a row per field (value, origin, doc), then exit 0; --workdir is not needed
  and, given, not created. The origins' rules: tests/configs/test_config_schema.py."""
  code, out, err = runs['show_config']
  assert code == 0 and err == '', err[-3000:]
  lines = out.splitlines()
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
  assert not os.path.exists(runs['dirs']['never_created'])


def test_workdir_is_required(runs):
  code, _, err = runs['no_workdir']
  assert code == 2
  assert err.strip() == 'train.py: error: --workdir is required'


def test_a_workdir_that_cannot_be_a_directory_is_one_line_and_the_file_is_kept(runs):
  """--workdir naming a file, or a path below one: one line, exit 2, the file as it was (it
  was a traceback from os.makedirs)."""
  a_file = runs['dirs']['a_file']
  for where, message in (('file', f'workdir {a_file} exists and is not a directory'),
                         ('under_a_file', f'cannot create workdir {a_file}/sub: Not a directory')):
    code, _, err = runs['not_a_dir', where]
    assert code == 2 and err.strip() == f'train.py: error: {message}', err[-3000:]
  with open(a_file) as f:
    assert f.read() == 'not a workdir\n'


def test_end_to_end_tiny_run_with_overrides_and_resume(runs):
  """The real input pipeline (bundled Multi30k), BLEU, outputs in DIR, then a resume."""
  workdir = runs['dirs']['e2e']
  code, out, err = runs['e2e']
  assert code == 0, out[-3000:] + err[-3000:]
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

  # Again with more steps (in a fresh interpreter): resumes at 4, reports the changed field.
  code, out, err = runs['resumed']
  assert code == 0, out[-3000:] + err[-3000:]
  assert 'resumed from the checkpoint at step 4' in out
  assert 'train.num_steps: 4 -> 6' in out
  assert 'step 6/6' in out and 'step 2/' not in out
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  assert config['model']['num_heads'] == 2 and config['train']['num_steps'] == 6
  names = os.listdir(workdir)
  assert 'checkpoints' in names and 'tokenizer' in names
  assert any(n.startswith('events.out.tfevents') for n in names)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4', '6']
  # ... exactly: its step 6 is bitwise a straight 6-step run's, through train.py and the real
  # data pipeline (the schedule does not read num_steps), on any machine and without root.
  code, out, err = runs['straight']
  assert code == 0, out[-3000:] + err[-3000:]
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  (resumed, step), (once, step_once) = (checkpoint.restore_params(w)
                                        for w in (workdir, runs['dirs']['straight']))
  assert step == step_once == 6
  for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(once), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_change_of_the_state_layout_is_refused_and_config_json_kept(runs):
  """Issue 58, cause 2: a field that changes the train state's tree but was not on the hand-made
  list (final_logits_bias adds a bias, optimizer.name another state) rewrote config.json before
  the refusal, and decode.py then refused the workdir. The fields are found by building both
  states abstractly; nothing is written. (Also the in-process refusal of a shape change that
  test_train_loop had: the same IncompatibleWorkdirError.)"""
  for flag, field in LAYOUTS:
    code, _, err = runs['layout', flag]
    assert code == 2 and f'holds a run with a different model/data setup: {field};' in err, err
  with open(os.path.join(runs['dirs']['layout'], 'config.json'), 'rb') as f:
    assert f.read() == runs['dirs']['layout_config']  # after each of the 4 refusals


def test_a_fine_tune_resumes_without_its_init_from_directory(runs):
  """Issue 58, cause 11: once a fine-tune has a checkpoint, its own config.json and
  checkpoints are enough to resume; the init_from directory may be gone (removed between
  the two interpreters)."""
  code, _, err = runs['fine_tune']
  assert code == 0, err
  code, out, err = runs['fine_tune_resumed']
  assert code == 0, err
  assert 'resumed from the checkpoint at step 2' in out + err
  assert 'done: step 4/4' in out + err


def test_init_from_refuses_a_field_that_adds_parameters_and_writes_nothing(runs):
  """Issue 81, cause 1: init_from with an override that adds parameters the source lacks
  (final_logits_bias, embedding_norm) was a JAX traceback on the trees' key sets, once the new
  workdir held its config.json, tokenizer and an event file. One line naming the field now,
  before anything is written."""
  source = runs['dirs']['source']
  for flag, adds in ADDS:
    code, _, err = runs['adds', flag]
    assert code == 2 and err.count('\n') == 1, err
    assert err.startswith(f'train.py: error: {flag} cannot be set with config.train.init_from='
                          f"'{source}'") and adds in err and f'{source} lack' in err, err
    assert not os.path.exists(runs['dirs']['adds']), os.listdir(runs['dirs']['adds'])


# Each command line, a flag of its own that its --help lists, and the first words of its doc.
COMMANDS = [(['train.py'], '--workdir', 'Train, evaluate and checkpoint a Transformer'),
            (['decode.py'], '--beam_size', 'Translate, generate or score'),
            (['sweep.py'], '--retry_failed', None), (['export.py'], '--output_dir', None),
            (['import.py'], '--from', None), (['-m', 'experiments.report'], '--output_dir', None),
            (['-m', 'experiments.archive'], '--root', 'python -m experiments.archive save')]


def test_every_command_prints_its_flags_on_help():
  """Issue 81, cause 2: `train.py --help` was `Unknown command line flag 'help'` (absl defines
  its help flags in app.run, after train.py's own parsing); every command prints its doc and
  flags on --help and --helpfull, and exits 0 (absl's help exited 1: a failure here)."""
  runs = [(args, flag, doc, helps) for args, flag, doc in COMMANDS
          for helps in (['--help'], ['--helpfull'])
          if helps == ['--help'] or args[0] in ('train.py', '-m')]
  procs = [subprocess.Popen([sys.executable, *args, *helps], env=syn.subprocess_env(1),
                            cwd=syn.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
           for args, _, _, helps in runs]
  for proc, (args, flag, doc, helps) in zip(procs, runs, strict=True):
    out, err = proc.communicate()
    what = f'{" ".join(args + helps)}: {err}'
    assert proc.returncode == 0 and not err, what
    assert flag in out, what
    if doc is not None:
      assert doc in out, what
    if helps == ['--helpfull'] and args[0] == 'train.py':  # and the libraries' flags
      assert '--jax_platforms' in out or 'absl.logging' in out, out
