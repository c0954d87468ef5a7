"""decode.py end to end on tiny trained checkpoints: translation, LM, bad input, 8 -> 1 devices."""

import gzip
import os
import shutil
import subprocess
import sys

import mains
import pytest
import test_train_synthetic as syn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'data', 'multi30k')


def _env(devices=None):
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  env['XLA_FLAGS'] = syn.xla_flags(devices)  # the suite's flags: the same compiles
  env.setdefault('JAX_PLATFORMS', 'cpu')
  return env


# `workdirs` (the tiny trained runs: mt, lm, mt8, scan) is a session fixture of conftest.py.


def _decode(*args, stdin=None, devices=None, cache=None):
  cmd = [sys.executable, os.path.join(ROOT, 'decode.py'), *args]
  if not any(a.startswith('--compilation_cache') for a in args):
    cmd.append(f'--compilation_cache={cache or ""}')
  return subprocess.run(cmd, cwd=ROOT, env=_env(devices), input=stdin, capture_output=True,
                        timeout=600, check=False)


def _snapshot(directory):
  """(path, size, mtime) of everything under `directory`: to prove it was not modified."""
  out = []
  for base, dirs, files in os.walk(directory):
    for name in sorted(dirs + files):
      path = os.path.join(base, name)
      st = os.stat(path)
      out.append((os.path.relpath(path, directory), st.st_size, st.st_mtime_ns))
  return sorted(out)


def _test_lines(n):
  with gzip.open(os.path.join(DATA, 'test_2016_flickr.en.gz'), 'rt', encoding='utf-8') as f:
    src = [next(f).rstrip('\n') for _ in range(n)]
  with gzip.open(os.path.join(DATA, 'test_2016_flickr.de.gz'), 'rt', encoding='utf-8') as f:
    ref = [next(f).rstrip('\n') for _ in range(n)]
  return src, ref


def _file_runs(workdirs, folder) -> dict:
  """name -> decode.py's command line, for the runs of the tests below that need no process
  of their own: all run in one interpreter (`mains`, module fixture `runs`; a process each
  spent ~1.5-3 s on start-up and restored and compiled the same models again)."""
  src, ref = _test_lines(4)
  long_line = ' '.join(['a very long sentence'] * 40)
  src = [src[0], '', src[1], long_line, src[2]]  # an empty and an over-long line
  ref = [ref[0], '', ref[1], ref[2], ref[3]]
  (folder / 'src.txt').write_text('\n'.join(src) + '\n', encoding='utf-8')
  with gzip.open(folder / 'ref.txt.gz', 'wt', encoding='utf-8') as f:  # .gz is read too
    f.write('\n'.join(ref) + '\n')
  (folder / 'two.txt').write_text('A man rides a bike.\nTwo dogs play in the snow.\n')
  (folder / 'two_short.txt').write_text('A man rides a bike.\nTwo dogs.\n')
  lm = (f'--workdir={workdirs["lm"]}', '--prompt=ROMEO:', '--num_tokens=40', '--top_k=5',
        '--temperature=0.8', '--seed=3', f'--compilation_cache={folder / "xla_cache"}')
  return {
      'translate': [f'--workdir={workdirs["mt"]}', f'--input_file={folder / "src.txt"}',
                    f'--output_file={folder / "out" / "hyp.txt"}',
                    f'--reference={folder / "ref.txt.gz"}', '--beam_size=2',
                    '--max_new_tokens=12', '--average_last=2', '--batch_size=2',
                    f'--attention_plot={folder / "plots"}', '--attention_plot_max=1',
                    '--lowercase_bleu', '--compilation_cache='],
      'mt8': [f'--workdir={workdirs["mt8"]}', '--beam_size=2', '--max_new_tokens=6',
              f'--input_file={folder / "two.txt"}', '--compilation_cache='],
      'scan': [f'--workdir={workdirs["scan"]}', '--beam_size=2', '--max_new_tokens=6',
               f'--attention_plot={folder / "scan_plots"}', '--attention_plot_heads=average',
               f'--input_file={folder / "two_short.txt"}', '--compilation_cache='],
      # Last: its --compilation_cache stays this interpreter's cache from here on.
      'lm': [*lm, f'--attention_plot={folder / "lm_plots"}'],
      'lm_again': [*lm],
  }


@pytest.fixture(scope='module')
def runs(workdirs, tmp_path_factory):
  """(folder of the runs' files, name -> (exit status, stdout, stderr) of `_file_runs`' command
  lines, run in one interpreter) and the mt workdir's snapshot from before they ran."""
  folder = tmp_path_factory.mktemp('decode_cli')
  command_lines = _file_runs(workdirs, folder)
  before = _snapshot(workdirs['mt'])
  results = mains.run_mains(list(command_lines.values()))
  return folder, dict(zip(command_lines, results, strict=True)), before


def test_translate_file_with_bleu_plots_and_averaging(workdirs, runs):
  tmp_path, results, before = runs
  code, _, err = results['translate']
  assert code == 0, err
  assert 'Traceback' not in err
  src = (tmp_path / 'src.txt').read_text(encoding='utf-8').split('\n')[:-1]
  with gzip.open(tmp_path / 'ref.txt.gz', 'rt', encoding='utf-8') as f:
    ref = f.read().split('\n')[:-1]
  hyp = (tmp_path / 'out' / 'hyp.txt').read_text(encoding='utf-8').split('\n')
  assert hyp[-1] == '' and len(hyp) == len(src) + 1  # one line per input line, in order
  assert hyp[1] == ''  # the empty line stays empty
  assert 'input line 4 has' in err and 'truncated' in err
  assert 'average of the last 2' in err
  assert 'BLEU = ' in err and 'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:' in err
  assert 'chrF2 = ' in err and 'nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:' in err
  assert 'BLEU (lowercased, tokenized) = ' in err and 'nrefs:1|case:lc|eff:no|tok:13a|' in err
  # The printed figures are the output's, scored as a sweep scores its runs (the empty line
  # and its reference left out, as decode.py scores the sentences it translated).
  from experiments import evaluate  # pylint: disable=import-outside-toplevel
  pairs = [(h, r) for h, r, s in zip(hyp[:-1], ref, src, strict=True) if s.strip()]
  found = evaluate.scores([h for h, _ in pairs], [r for _, r in pairs])
  for name, printed in (('bleu', 'BLEU'), ('bleu_lowercased', 'BLEU (lowercased, tokenized)'),
                        ('chrf2', 'chrF2')):
    line = f'{printed} = {found[name]:.2f}  {found[f"{name}_signature"]}'
    assert line in err, (line, err)
  pngs = sorted(p.name for p in (tmp_path / 'plots' / 'line_00001').iterdir())
  for kind in ('encoder_layer_1_self_attention', 'decoder_layer_0_self_attention',
               'decoder_layer_1_cross_attention'):
    assert f'{kind}_average.png' in pngs and f'{kind}_head_3.png' in pngs, pngs
  # 2 layers x (enc self, dec self, cross) x (4 heads + average), and the overview grid.
  assert 'overview.png' in pngs and len(pngs) == 2 * 3 * 5 + 1
  with open(tmp_path / 'plots' / 'line_00001' / pngs[0], 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert _snapshot(workdirs['mt']) == before  # nothing in the workdir was modified


# stdin to stdout, greedy, at an earlier checkpoint (--step): test_decode_modes'
# test_translation_stream_is_answered_line_by_line (a process of its own less).


def test_checkpoint_from_8_devices_decodes_on_1(workdirs, runs):
  """A checkpoint written by an 8-device run restores on 1 device and translates. That
  decode.py on 8 devices gives 1 device's translations (its own process here before) is
  test_sharded_decoding's test_decode_py_with_mesh_decodes_a_2x4x1_checkpoint_as_one_device
  (a checkpoint of an 8-device run decoded on 1 device and sharded over 8; without --mesh
  decode.py puts the parameters on one device, as on a 1-device host: workdir/restore.py)."""
  assert 'over 8 cpu device(s)' in workdirs['mt8_log'], workdirs['mt8_log'][-2000:]
  code, out, err = runs[1]['mt8']
  assert code == 0, err
  assert len(out.splitlines()) == 2 and all(line.strip() for line in out.splitlines()), out


def test_scan_layers_model_trains_evaluates_and_decodes(workdirs, runs):
  """Decoding and attention plots run a `scan_layers` model unrolled (one KV cache and one
  set of sown weights per layer), in the trainer's BLEU evaluation and in decode.py."""
  assert 'BLEU ' in workdirs['scan_log'], workdirs['scan_log'][-2000:]
  tmp_path, results, _ = runs
  code, out, err = results['scan']
  assert code == 0, err
  assert out.count('\n') == 2
  pngs = sorted(p.name for p in (tmp_path / 'scan_plots' / 'line_00001').iterdir())
  assert 'encoder_layer_1_self_attention_average.png' in pngs, pngs
  assert len(pngs) == 2 * 3 + 1  # 2 layers x (enc self, dec self, cross), averages only; overview


def test_language_model_prompt_longer_than_context(runs):
  # The tiny LM sees 33 positions: 40 new characters need a second window.
  tmp_path, results, _ = runs
  code, text, err = results['lm']
  assert code == 0, err
  assert text.startswith('ROMEO:')
  assert len(text) - 1 == len('ROMEO:') + 40  # characters: exactly num_tokens, no EOS
  assert any(p.name.endswith('.png') for p in (tmp_path / 'lm_plots' / 'line_00001').iterdir())
  assert results['lm_again'][:2] == (0, text)  # same seed, same text (its cache warm)


def test_bad_input_one_clear_error_and_workdir_untouched(workdirs, tmp_path):
  mt, lm = workdirs['mt'], workdirs['lm']
  no_ckpt = tmp_path / 'no_ckpt'
  no_ckpt.mkdir()
  shutil.copy(os.path.join(mt, 'config.json'), no_ckpt / 'config.json')
  shutil.copytree(os.path.join(mt, 'tokenizer'), no_ckpt / 'tokenizer')
  mixed = tmp_path / 'mixed'  # an LM's config.json (and tokenizer) next to a translation checkpoint
  shutil.copytree(mt, mixed)
  shutil.copy(os.path.join(lm, 'config.json'), mixed / 'config.json')
  shutil.rmtree(mixed / 'tokenizer')
  shutil.copytree(os.path.join(lm, 'tokenizer'), mixed / 'tokenizer')
  other_tokenizer = tmp_path / 'other_tokenizer'  # issue 45 item 7: the LM's characters
  shutil.copytree(mt, other_tokenizer, ignore=shutil.ignore_patterns('tokenizer'))
  shutil.copytree(os.path.join(lm, 'tokenizer'), other_tokenizer / 'tokenizer')
  (tmp_path / 'bad.txt').write_bytes(b'A good line.\nA bad \xff line.\n')
  (tmp_path / 'one.txt').write_text('One line.\n')
  (tmp_path / 'two.txt').write_text('One.\nTwo.\n')
  cases = {
      'missing workdir': ([f'--workdir={tmp_path / "nope"}'], 'does not exist'),
      'no checkpoint': ([f'--workdir={no_ckpt}'], 'no checkpoint in'),
      'prompt to a translation model': ([f'--workdir={mt}', '--prompt=Hi'], 'language model'),
      'reference for an LM': ([f'--workdir={lm}', f'--input_file={tmp_path / "one.txt"}',
                               f'--reference={tmp_path / "one.txt"}'], 'is for translation'),
      'non-UTF-8 line': ([f'--workdir={mt}', f'--input_file={tmp_path / "bad.txt"}'],
                         'line 2 is not valid UTF-8'),
      'reference line count': ([f'--workdir={mt}', f'--input_file={tmp_path / "one.txt"}',
                                f'--reference={tmp_path / "two.txt"}'], 'has 2 lines but'),
      'unknown step': ([f'--workdir={mt}', '--step=999', f'--input_file={tmp_path / "one.txt"}'],
                       'no checkpoint for step 999'),
      'checkpoint of another model': ([f'--workdir={mixed}', '--prompt=Hi'], 'does not fit'),
      "another workdir's tokenizer": (
          [f'--workdir={other_tokenizer}', f'--input_file={tmp_path / "one.txt"}'],
          f'the tokenizer {other_tokenizer}/tokenizer/tokenizer.json is a char tokenizer of '),
  }
  before = {d: _snapshot(d) for d in (mt, lm, str(no_ckpt))}
  # Most in one interpreter (`mains`: a process each was mostly interpreter start-up);
  # as processes of their own (all at once): a failed restore (Orbax may leave work behind,
  # which the error's exit then skips) and one refused before anything is restored.
  own = ('checkpoint of another model', 'non-UTF-8 line')
  results = {}
  procs = {}
  for name in own:
    cmd = [sys.executable, os.path.join(ROOT, 'decode.py'), '--compilation_cache=',
           *cases[name][0]]
    procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  batched = [name for name in cases if name not in own]
  results.update(zip(batched, mains.run_mains(
      [['--compilation_cache=', *cases[name][0]] for name in batched]), strict=True))
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=600)
    results[name] = (proc.returncode, out.decode(), err.decode())
  assert sorted(results) == sorted(cases)
  for name, (code, out, err) in results.items():
    assert code == 2, (name, code, err[-2000:])
    assert 'Traceback' not in err, (name, err)
    errors = [line for line in err.splitlines() if line.startswith('decode.py: error:')]
    assert len(errors) == 1 and cases[name][1] in errors[0], (name, err)
    assert out == ''
  assert {d: _snapshot(d) for d in before} == before
