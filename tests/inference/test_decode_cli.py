"""decode.py end to end on the suite's tiny trained workdirs (`workdirs`, conftest.py): files
with BLEU, attention plots and averaging; a `scan_layers` model; a language model past its
context; streaming stdin (each line answered before the next is written);
n-best and jsonl; forced decoding of references; sampled translations; every row of the
strategy table; and what it refuses (bad input, flags out of range or not applying), in one
line, exit 2, the workdir untouched. The command lines that need no process of their own run in
one interpreter (`mains`, module fixture `runs`)."""

import gzip
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
from typing import NamedTuple

import pytest

from autoregressive import strategies
from tests import REPO, mains
from tests.training import test_train_synthetic as syn

DATA = os.path.join(REPO, 'data', 'multi30k')
SENTENCES = ['A man rides a bike.', '', 'Two dogs play in the snow.', 'A woman is singing.']


def _env():
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
  env['XLA_FLAGS'] = syn.xla_flags()  # the suite's flags: the same compiles
  env.setdefault('JAX_PLATFORMS', 'cpu')
  return env


# `workdirs` (the tiny trained runs: mt, lm, scan) is a session fixture of conftest.py.

# decode.py with SIGINT as a terminal delivers it: a pytest-xdist worker ignores SIGINT, a child
# inherits that, and Python then installs no KeyboardInterrupt handler.
_INTERRUPTIBLE = ('import runpy, signal, sys; signal.signal(signal.SIGINT, '
                  'signal.default_int_handler); sys.argv = sys.argv[1:]; '
                  "runpy.run_path(sys.argv[0], run_name='__main__')")


def _start(*args, stdin=subprocess.PIPE, interruptible=False):
  cmd = [sys.executable, *(('-c', _INTERRUPTIBLE) if interruptible else ()),
         os.path.join(REPO, 'decode.py'), *args]
  return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdin=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)


class _Conversation:
  """decode.py on a pipe: `ask(line)` writes one line and returns the first output line,
  before anything else is written (failing, not hanging, if none comes)."""

  def __init__(self, *args, interruptible=False):
    self.proc = _start(*args, interruptible=interruptible)
    self.lines: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in iter(self.proc.stdout.readline, b''):
      self.lines.put(line.decode())
    self.lines.put(None)

  def ask(self, line: str) -> str:
    self.proc.stdin.write(line.encode() + b'\n')
    self.proc.stdin.flush()
    try:  # a bound that is the check (an answer while the input stays open), not a guard
      answer = self.lines.get(timeout=300)
    except queue.Empty:
      self.proc.kill()
      raise AssertionError(f'no answer to {line!r} while the input stays open') from None
    assert answer is not None, self.proc.stderr.read().decode()[-3000:]
    return answer

  def close(self) -> str:
    self.proc.stdin.close()
    assert self.proc.wait() == 0
    assert self.lines.get() is None  # nothing more was written
    return self.proc.stderr.read().decode()


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


def _mode_runs(workdirs, folder) -> dict:
  """name -> decode.py's command line of the modes' runs that read files (n-best, scoring,
  sampling, the table's rows) and of the refused flags."""
  source, reference = folder / 'modes_src.txt', folder / 'modes_ref.txt'
  source.write_text('\n'.join(SENTENCES) + '\n', encoding='utf-8')
  score_source = folder / 'score_src.txt'
  score_source.write_text('A man rides a bike.\n\nTwo dogs.\n', encoding='utf-8')
  reference.write_text('Ein Mann fährt Rad.\nX\nZwei Hunde.\n', encoding='utf-8')
  mt = f'--workdir={workdirs["mt"]}'
  nbest = (mt, f'--input_file={source}', '--beam_size=3', '--nbest=3', '--alpha=0.6',
           '--max_new_tokens=8', '--compilation_cache=')
  score = (mt, f'--input_file={score_source}', f'--score_reference={reference}',
           '--compilation_cache=')
  sampled = (mt, '--strategy=sampling', '--nbest=2', '--max_new_tokens=6', '--temperature=0.9',
             '--compilation_cache=', f'--input_file={source}')
  runs = {'nbest_jsonl': [*nbest, '--output_format=jsonl'], 'nbest_text': [*nbest],
          'score_text': [*score], 'score_jsonl': [*score, '--output_format=jsonl'],
          'sampled_5': [*sampled, '--seed=5'], 'sampled_6': [*sampled, '--seed=6']}
  # test_strategies' rows through decode.py: here, in this interpreter (one start-up less).
  runs.update({('row', name): [mt, f'--input_file={score_source}', f'--strategy={name}',
                               '--max_new_tokens=6', '--compilation_cache=']
               for name in strategies.TABLE})
  runs.update({('refused', *name): args for name, (args, _) in _refusal_cases(workdirs).items()})
  return runs


def _file_runs(workdirs, folder) -> dict:
  """name -> decode.py's command line of the runs that translate files (BLEU, plots,
  averaging; a scanned model) and of the language model's."""
  src, ref = _test_lines(4)
  long_line = ' '.join(['a very long sentence'] * 40)
  src = [src[0], '', src[1], long_line, src[2]]  # an empty and an over-long line
  ref = [ref[0], '', ref[1], ref[2], ref[3]]
  (folder / 'src.txt').write_text('\n'.join(src) + '\n', encoding='utf-8')
  with gzip.open(folder / 'ref.txt.gz', 'wt', encoding='utf-8') as f:  # .gz is read too
    f.write('\n'.join(ref) + '\n')
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
      'scan': [f'--workdir={workdirs["scan"]}', '--beam_size=2', '--max_new_tokens=6',
               f'--attention_plot={folder / "scan_plots"}', '--attention_plot_heads=average',
               f'--input_file={folder / "two_short.txt"}', '--compilation_cache='],
      # Last: its --compilation_cache stays this interpreter's cache from here on.
      'lm': [*lm, f'--attention_plot={folder / "lm_plots"}'],
      'lm_again': [*lm],
  }


class Runs(NamedTuple):
  folder: pathlib.Path  # the runs' files
  results: dict  # name -> (exit status, stdout, stderr)
  before: dict  # workdir -> its `_snapshot` from before the runs
  bad_input: dict  # `_bad_input_cases`


@pytest.fixture(scope='module')
def runs(workdirs, tmp_path_factory) -> Runs:
  """`_mode_runs`', the bad input's and `_file_runs`' command lines, run in one interpreter (a
  process each spent ~1.5-3 s on start-up and restored and compiled the same models again),
  but for the bad input's OWN_PROCESS cases, which its test starts."""
  folder = tmp_path_factory.mktemp('decode_cli')
  bad_input = _bad_input_cases(workdirs, folder)
  command_lines = {
      **_mode_runs(workdirs, folder),
      **{('bad', name): ['--compilation_cache=', *args] for name, (args, _) in bad_input.items()
         if name not in OWN_PROCESS},
      **_file_runs(workdirs, folder)}  # last: the language model's runs set a cache
  before = {d: _snapshot(d) for d in (workdirs['mt'], workdirs['lm'], folder / 'bad_input')}
  results = mains.run_mains(list(command_lines.values()))
  return Runs(folder, dict(zip(command_lines, results, strict=True)), before, bad_input)


# ----------------------------------------------------------------------------- files and models

def test_translate_file_with_bleu_plots_and_averaging(workdirs, runs):
  tmp_path, results, before = runs.folder, runs.results, runs.before[workdirs['mt']]
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
  for kind in ('encoder_layer_0_self_attention', 'decoder_layer_0_self_attention',
               'decoder_layer_0_cross_attention'):
    assert f'{kind}_average.png' in pngs and f'{kind}_head_3.png' in pngs, pngs
  # 1 layer x (enc self, dec self, cross) x (4 heads + average), and the overview grid.
  assert 'overview.png' in pngs and len(pngs) == 3 * 5 + 1
  with open(tmp_path / 'plots' / 'line_00001' / pngs[0], 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert _snapshot(workdirs['mt']) == before  # nothing in the workdir was modified


def test_scan_layers_model_trains_evaluates_and_decodes(workdirs, runs):
  """Decoding and attention plots run a `scan_layers` model unrolled (one KV cache and one
  set of sown weights per layer), in the trainer's BLEU evaluation and in decode.py."""
  assert 'BLEU ' in workdirs['scan_log'], workdirs['scan_log'][-2000:]
  tmp_path, results = runs.folder, runs.results
  code, out, err = results['scan']
  assert code == 0, err
  assert out.count('\n') == 2
  pngs = sorted(p.name for p in (tmp_path / 'scan_plots' / 'line_00001').iterdir())
  assert 'encoder_layer_1_self_attention_average.png' in pngs, pngs
  assert len(pngs) == 2 * 3 + 1  # 2 layers x (enc self, dec self, cross), averages only; overview


def test_language_model_prompt_longer_than_context(runs):
  # The tiny LM sees 33 positions: 40 new characters need a second window.
  tmp_path, results = runs.folder, runs.results
  code, text, err = results['lm']
  assert code == 0, err
  assert text.startswith('ROMEO:')
  assert len(text) - 1 == len('ROMEO:') + 40  # characters: exactly num_tokens, no EOS
  assert any(p.name.endswith('.png') for p in (tmp_path / 'lm_plots' / 'line_00001').iterdir())
  assert results['lm_again'][:2] == (0, text)  # same seed, same text (its cache warm)


# ----------------------------------------------------------------------------- streams

def test_translation_stream_is_answered_line_by_line(workdirs):
  """Also decode.py's stdin to stdout at an earlier checkpoint (`--step`), and a
  max_new_tokens past the model's positions capped with one warning, not one per chunk of the
  stream."""
  talk = _Conversation(f'--workdir={workdirs["mt"]}', '--step=10', '--beam_size=1',
                       '--max_new_tokens=1000', '--compilation_cache=')
  first = talk.ask('A man rides a bike.')
  assert first.endswith('\n') and first.strip()
  assert talk.ask('') == '\n'  # an empty line gives an empty line
  assert talk.ask('A man rides a bike.') == first
  err = talk.close()
  assert 'translated 2 sentence(s) (greedy)' in err and 'Traceback' not in err
  assert 'step 10' in err
  assert err.count("max_new_tokens 1000 is more than the model's max_len") == 1, err[-2000:]
  import inference  # pylint: disable=import-outside-toplevel  # the same from Python
  session = inference.load(workdirs['mt'], step=10, warn=lambda message: None)
  assert session.translate(['A man rides a bike.'], beam_size=1, max_new_tokens=1000) == [
      first[:-1]]


def test_a_stream_stops_cleanly_on_a_bad_line_or_ctrl_c(workdirs):
  """With the input still open: a non-UTF-8 line is one error line naming it, after the line
  before it (read in the same chunk) was answered, exit 2; Ctrl-C while waiting for input is
  one line, exit 130. Neither aborts on the reader thread (once: 'Fatal Python error:
  _enter_buffered_busy', SIGABRT)."""
  args = (f'--workdir={workdirs["mt"]}', '--beam_size=1', '--max_new_tokens=6',
          '--compilation_cache=')
  bad = _start(*args)
  bad.stdin.write(b'A man rides a bike.\n\xff bad\n')
  bad.stdin.flush()  # and left open
  try:
    code = bad.wait()
  finally:
    bad.kill()
  out, err = bad.stdout.read().decode(), bad.stderr.read().decode()
  assert code == 2 and len(out.splitlines()) == 1 and out.strip(), (code, out, err[-2000:])
  assert err.strip().splitlines()[-1] == ('decode.py: error: input <stdin> line 2 is not '
                                         'valid UTF-8 (byte 0xff at column 1)')
  assert 'Fatal Python error' not in err and 'Traceback' not in err
  talk = _Conversation(*args, interruptible=True)
  assert talk.ask('A man rides a bike.').strip()
  talk.proc.send_signal(signal.SIGINT)
  assert talk.proc.wait() == 130
  err = talk.proc.stderr.read().decode()
  assert err.strip().splitlines()[-1] == 'decode.py: error: interrupted', err[-2000:]
  assert 'Fatal Python error' not in err and 'Traceback' not in err




# decode_cli.run has begun (its set-up): the gc callback's condition.
_IN_DECODE_RUN = ("any(f.f_code.co_name == 'run' and "
                  "f.f_code.co_filename.endswith('decode_cli.py') for f in frames)")


def test_a_ctrl_c_that_python_drops_during_the_set_up_stops_before_writing(workdirs, tmp_path):
  """A Ctrl-C that lands in a garbage-collection callback (JAX registers one) while decode.py
  sets up is dropped by Python: the whole file was decoded, exit 0. It is remembered and stops
  decode.py before its first chunk: one line, exit 130, no output file."""
  source, out = tmp_path / 'in.en', tmp_path / 'out.de'
  source.write_text('A man rides a bike.\nTwo dogs play.\n')
  script = mains.dropped_ctrl_c(os.path.join(REPO, 'decode.py'), _IN_DECODE_RUN)
  proc = subprocess.run([sys.executable, '-c', script,
                         f'--workdir={workdirs["mt"]}', f'--input_file={source}',
                         f'--output_file={out}', '--beam_size=1', '--max_new_tokens=6'],
                        cwd=REPO, env=_env(), capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 130, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == 'decode.py: error: interrupted', proc.stderr
  assert not out.exists()


def test_language_model_stream_is_answered_prompt_by_prompt(workdirs):
  talk = _Conversation(f'--workdir={workdirs["lm"]}', '--input_file=-', '--num_tokens=5',
                       '--temperature=0', '--output_format=jsonl', '--compilation_cache=')
  first = json.loads(talk.ask('ROMEO:'))
  assert first['prompt'] == 'ROMEO:' and len(first['tokens']) == 5
  assert json.loads(talk.ask('JULIET:\\nO'))['prompt'] == 'JULIET:\nO'  # \n is a newline
  assert json.loads(talk.ask('ROMEO:')) == first  # greedy: the same continuation
  assert 'generated 15 tokens for 3 prompt(s)' in talk.close()


# ----------------------------------------------------------------------------- modes

def test_nbest_text_and_jsonl(runs):
  (code, jsonl, err), (text_code, text, _) = runs.results['nbest_jsonl'], runs.results['nbest_text']
  assert code == 0 and text_code == 0, err[-3000:]
  objects = [json.loads(line) for line in jsonl.splitlines()]
  assert [o['source'] for o in objects] == SENTENCES  # one object per input line, in order
  assert [len(o['hypotheses']) for o in objects] == [3, 0, 3, 3]
  summary = err.strip().splitlines()[-1]
  cut = sum(len(o['hypotheses'][0]['tokens']) == 8 and o['hypotheses'][0]['tokens'][-1] != 1
            for o in objects if o['hypotheses'])
  assert summary.endswith(f'; 0 empty, {cut} cut at 8 tokens'), summary
  rows = []
  for index, o in enumerate(objects):
    scores = [h['score'] for h in o['hypotheses']]
    assert scores == sorted(scores, reverse=True)  # best first
    for h in o['hypotheses']:
      assert set(h) == {'text', 'score', 'log_prob', 'tokens'}
      penalty = ((5 + len(h['tokens'])) / 6) ** 0.6
      assert h['log_prob'] == pytest.approx(h['score'] * penalty, rel=1e-5)
      rows.append(f'{index}\t{h["score"]:.4f}\t{h["text"]}')
  assert text.splitlines() == rows  # index<TAB>score<TAB>text, N lines per input


def test_score_reference_is_the_models_log_probability(workdirs, runs):
  code, text, err = runs.results['score_text']
  assert code == 0, err
  assert 'scored 2 reference(s)' in err
  lines = text.split('\n')
  assert len(lines) == 4 and lines[1] == '' and lines[3] == ''  # empty source: empty line
  import inference  # pylint: disable=import-outside-toplevel
  expected = inference.load(workdirs['mt']).score(['A man rides a bike.', '', 'Two dogs.'],
                                                   ['Ein Mann fährt Rad.', 'X', 'Zwei Hunde.'])
  assert lines[0] == f'{expected[0]:.4f}\tEin Mann fährt Rad.'
  assert lines[2] == f'{expected[2]:.4f}\tZwei Hunde.' and expected[1] is None
  code, jsonl, err = runs.results['score_jsonl']
  assert code == 0, err
  first = json.loads(jsonl.splitlines()[0])
  assert first['reference'] == 'Ein Mann fährt Rad.' and first['tokens'][-1] == 1  # EOS
  assert first['log_prob'] == pytest.approx(expected[0], abs=1e-4)


def test_sampled_translations_are_reproducible(workdirs, runs):
  """The same seed gives the same samples: in one interpreter (`runs`) reading a file, and in a
  process of its own reading a pipe line by line (other batches). (A second run with seed 5
  in `runs` is gone: the piped run already repeats it.)"""
  args = (f'--workdir={workdirs["mt"]}', '--strategy=sampling', '--nbest=2', '--max_new_tokens=6',
          '--temperature=0.9', '--compilation_cache=', '--seed=5')
  piped = _start(*args)
  out, err = piped.communicate(('\n'.join(SENTENCES) + '\n').encode())
  assert piped.returncode == 0, err.decode()[-3000:]
  outs = []
  for name in ('sampled_5', 'sampled_6'):
    code, text, run_err = runs.results[name]
    assert code == 0, run_err[-3000:]
    outs.append(text)
  outs.append(out.decode())
  assert 'translated 3 sentence(s) (sampling, 2 per sentence)' in err.decode()
  assert 'translated 3 sentence(s) (sampling, 2 per sentence)' in runs.results['sampled_5'][2]
  assert outs[0] == outs[2]  # same seed, same samples, however they are batched
  assert outs[0] != outs[1]
  assert [line.split('\t')[0] for line in outs[0].splitlines()] == ['0', '0', '2', '2', '3', '3']


def test_every_row_is_reachable_from_decode_py(runs):
  """Each row of the strategy table (tests/decoding/test_strategies.py) translates through
  decode.py."""
  for name in strategies.TABLE:
    code, out, err = runs.results[('row', name)]
    assert code == 0, (name, err[-2000:])
    assert len(out.splitlines()) == 3 and out.splitlines()[1] == '', (name, out)
    described = {'beam': 'beam 2, alpha', 'greedy': 'greedy', 'sampling': 'sampling'}[name]
    assert f'translated 2 sentence(s) ({described}' in err, (name, err)


# ----------------------------------------------------------------------------- refusals

MT_REFUSALS = {
    '--beam_size=abc': 'flag --beam_size=abc: invalid literal',
    '--beam_size=1.5': 'flag --beam_size=1.5',
    '--beam_size=99999999999999999999': '--beam_size=99999999999999999999 must be an integer '
                                        'in [1, 1024]',
    '--batch_size=0': '--batch_size=0 must be an integer in [1, 65536]',
    '--max_len=8': "Unknown command line flag 'max_len'. Did you mean: max_new_tokens",  # 0.2.0
    '--max_new_tokens=99999999999999999999': '--max_new_tokens=99999999999999999999 must be an '
                                             'integer',
    '--nbest=99999999999999999999': '--nbest=99999999999999999999 must be an integer',
    '--average_last=99999999999999999999': '--average_last=99999999999999999999 must be',
    '--step=-1': '--step=-1 must be an integer in [0, ',
    '--alpha=1e308': '--alpha=1e+308 must be a number in [0, 10] (a normal float32)',
    '--top_p=1e308': '--top_p=1e+308 must be a number in (0, 1]',
    '--top_p=1e-40': '--top_p=1e-40 must be a number in (0, 1] (a normal float32)',
    '--strategy=diverse': 'flag --strategy=diverse: value should be one of <beam|greedy|sampling>',
    '--input_file=/': '--input_file / is a directory',
    '--temperature=0.7': '--temperature applies to sampling, not to beam (choose it with '
                         '--strategy=sampling)',
    '--beam_size=1 --seed=3': '--seed applies to sampling, not to greedy',
    '--beam_size=1 --alpha=0.5': '--alpha applies to beam, not to greedy',
    '--strategy=greedy --nbest=2': '--nbest=2 is more than greedy decoding finds (1)',
    '--strategy=sampling --beam_size=3': '--beam_size applies to beam, not to sampling',
    '--strategy=sampling --alpha=0.5': '--alpha applies to beam, not to sampling',
    '--nbest=3': '--nbest=3 is more than the beam size 2',
    '--num_tokens=5': '--num_tokens is for a language model',
    '--lowercase_bleu': '--lowercase_bleu needs --reference',
    '--attention_plot_heads=average': '--attention_plot_heads needs --attention_plot',
    '--score_reference=README.md --beam_size=2': '--beam_size does not apply to '
                                                 '--score_reference',
    '--compilation_cache=WORKDIR/xla': '--compilation_cache WORKDIR/xla is inside --workdir',
    # Outputs are checked before anything is restored (common.atomic_file's rules).
    '--output_file=WORKDIR/config.json': '--output_file WORKDIR/config.json is',
    '--attention_plot=WORKDIR/checkpoints/plots': '--attention_plot WORKDIR/checkpoints/plots is '
                                                  '(or is inside) WORKDIR',
    '--attention_plot=README.md': '--attention_plot README.md is a file, not a directory',
    '--attention_plot=README.md/plots': '--attention_plot README.md/plots lies below ',
    '--min_new_tokens=-1': '--min_new_tokens=-1 must be an integer in [0, ',
    '--min_new_tokens=9 --max_new_tokens=8': '--min_new_tokens=9 is more than '
                                             '--max_new_tokens=8',
    '--score_reference=README.md --min_new_tokens=2': '--min_new_tokens does not apply to '
                                                      '--score_reference',
    '--score_reference=README.md --strategy=greedy': '--strategy does not apply to '
                                                     '--score_reference',
    # As for a language model (issue 58, cause 8): at temperature 0 sampling is greedy.
    '--strategy=sampling --temperature=0 --top_k=5': '--top_k applies to sampling, but the '
                                                     'temperature is 0',
    '--strategy=sampling --temperature=0 --seed=3': '--seed applies to sampling, but the '
                                                    'temperature is 0',
}
LM_REFUSALS = {
    '--temperature=1e308': '--temperature=1e+308 must be 0 (greedy) or a number in [0.001, 1000]',
    '--temperature=1e-9': '--temperature=1e-09 must be 0 (greedy) or a number in [0.001, 1000]',
    '--seed=99999999999999999999': '--seed=99999999999999999999 must be an integer in [0, '
                                   '4294967295]',
    '--num_tokens=99999999999999999999': '--num_tokens=99999999999999999999 must be an integer',
    '--score_reference=README.md': '--score_reference is for translation',
    '--beam_size=2': '--beam_size is for translation',
    '--max_new_tokens=5': '--max_new_tokens is for translation, but',
    '--nbest=2': '--nbest is for translation',
    '--strategy=sampling': '--strategy is for translation',
    '--temperature=0 --top_k=3': '--top_k applies to sampling, but the temperature is 0',
    '--prompt=a --input_file=README.md': '--prompt and --input_file both give prompts',
}


def _refusal_cases(workdirs):
  """(kind, flags) -> (arguments, message); WORKDIR in a case is the kind's workdir."""
  cases = {}
  for kind, refusals in (('mt', MT_REFUSALS), ('lm', LM_REFUSALS)):
    for flags_, message in refusals.items():
      args = flags_.replace('WORKDIR', workdirs[kind]).split()
      if not any(a.startswith('--compilation_cache') for a in args):
        args.append('--compilation_cache=')
      cases[kind, flags_] = ([f'--workdir={workdirs[kind]}', *args],
                             message.replace('WORKDIR', workdirs[kind]))
  return cases


def _assert_refused(name, code, out, err, message):
  assert code == 2 and out == '', (name, code, err[-2000:])
  assert err.splitlines() == [err.splitlines()[0]] and 'Traceback' not in err, (name, err)
  assert err.startswith(f'decode.py: error: {message}'), (name, err)


def test_flags_out_of_range_or_not_applying_are_one_line(workdirs, runs):
  cases = _refusal_cases(workdirs)
  for name, (_, message) in cases.items():
    _assert_refused(name, *runs.results[('refused', *name)], message)
  # And as their own processes (exit status, nothing else on stderr): a bad literal (absl's
  # parser), a number out of range, a flag that does not apply to the model kind.
  procs = {name: _start(*cases[name][0], stdin=subprocess.DEVNULL)
           for name in (('mt', '--beam_size=abc'), ('mt', '--batch_size=0'),
                                 ('lm', '--strategy=sampling'))}
  for name, proc in procs.items():
    out, err = proc.communicate()
    _assert_refused(name, proc.returncode, out.decode(), err.decode(), cases[name][1])


def _bad_input_cases(workdirs, folder) -> dict:
  """name -> (decode.py's arguments, the error's words) of bad workdirs and inputs."""
  mt, lm = workdirs['mt'], workdirs['lm']
  folder = folder / 'bad_input'
  no_ckpt = folder / 'no_ckpt'
  no_ckpt.mkdir(parents=True)
  shutil.copy(os.path.join(mt, 'config.json'), no_ckpt / 'config.json')
  shutil.copytree(os.path.join(mt, 'tokenizer'), no_ckpt / 'tokenizer')
  mixed = folder / 'mixed'  # an LM's config.json (and tokenizer) next to a translation checkpoint
  shutil.copytree(mt, mixed)
  shutil.copy(os.path.join(lm, 'config.json'), mixed / 'config.json')
  shutil.rmtree(mixed / 'tokenizer')
  shutil.copytree(os.path.join(lm, 'tokenizer'), mixed / 'tokenizer')
  other_tokenizer = folder / 'other_tokenizer'  # the LM's characters
  shutil.copytree(mt, other_tokenizer, ignore=shutil.ignore_patterns('tokenizer'))
  shutil.copytree(os.path.join(lm, 'tokenizer'), other_tokenizer / 'tokenizer')
  (folder / 'bad.txt').write_bytes(b'A good line.\nA bad \xff line.\n')
  (folder / 'one.txt').write_text('One line.\n')
  (folder / 'two.txt').write_text('One.\nTwo.\n')
  return {
      'missing workdir': ([f'--workdir={folder / "nope"}'], 'does not exist'),
      'workdir is a file': ([f'--workdir={folder / "one.txt"}'], 'is not a directory'),
      'no checkpoint': ([f'--workdir={no_ckpt}'], 'no checkpoint in'),
      'prompt to a translation model': ([f'--workdir={mt}', '--prompt=Hi'], 'language model'),
      'reference for an LM': ([f'--workdir={lm}', f'--input_file={folder / "one.txt"}',
                               f'--reference={folder / "one.txt"}'], 'is for translation'),
      'non-UTF-8 line': ([f'--workdir={mt}', f'--input_file={folder / "bad.txt"}'],
                         'line 2 is not valid UTF-8'),
      'reference line count': ([f'--workdir={mt}', f'--input_file={folder / "one.txt"}',
                                f'--reference={folder / "two.txt"}'], 'has 2 lines but'),
      'unknown step': ([f'--workdir={mt}', '--step=999', f'--input_file={folder / "one.txt"}'],
                       'no checkpoint for step 999'),
      'checkpoint of another model': ([f'--workdir={mixed}', '--prompt=Hi'], 'does not fit'),
      "another workdir's tokenizer": (
          [f'--workdir={other_tokenizer}', f'--input_file={folder / "one.txt"}'],
          f'the tokenizer {other_tokenizer}/tokenizer/tokenizer.json is a char tokenizer of '),
  }


# As processes of their own (all at once): a failed restore (Orbax may leave work behind, which
# the error's exit then skips) and one refused before anything is restored.
OWN_PROCESS = ('checkpoint of another model', 'non-UTF-8 line')


def test_bad_input_one_clear_error_and_workdir_untouched(workdirs, runs):
  cases, results, before = runs.bad_input, runs.results, runs.before
  procs = {}
  for name in OWN_PROCESS:
    cmd = [sys.executable, os.path.join(REPO, 'decode.py'), '--compilation_cache=',
           *cases[name][0]]
    procs[name] = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  found = {name: results['bad', name] for name in cases if name not in OWN_PROCESS}
  for name, proc in procs.items():
    out, err = proc.communicate()
    found[name] = (proc.returncode, out.decode(), err.decode())
  assert sorted(found) == sorted(cases)
  for name, (code, out, err) in found.items():
    assert code == 2, (name, code, err[-2000:])
    assert 'Traceback' not in err, (name, err)
    errors = [line for line in err.splitlines() if line.startswith('decode.py: error:')]
    assert len(errors) == 1 and cases[name][1] in errors[0], (name, err)
    assert out == ''
  assert {d: _snapshot(d) for d in before} == before  # the workdirs, and no_ckpt
