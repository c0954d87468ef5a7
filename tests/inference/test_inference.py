"""The inference package in-process, on tiny random models (no training): the Session API
(n-best, scores, sampling, forced decoding, generation), its refusals, streaming input and the
output formats. decode.py end to end is in tests/inference/test_decode_cli.py."""

import importlib.util
import json
import os
import threading

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

import inference
from autoregressive import strategies
from autoregressive.scoring import forced_log_probs
from autoregressive.session import Session
from inference import streaming
from model import ModelConfig, bind, build_model, params_of

ALPHABET = 'abcdefghijklmnopqrstuvwxyz '


class _Tokenizer:
  """Characters as ids 3.. and EOS = 1 (as sentencepiece's pad=0, eos=1, unk=2)."""
  eos_id = 1

  def encode(self, text, target=False):
    del target  # one vocabulary for both sides
    if any(c not in ALPHABET for c in text):
      raise ValueError(f'{text!r} has a character outside the vocabulary')
    return [3 + ALPHABET.index(c) for c in text] + [self.eos_id]

  def decode(self, ids):
    return ''.join(ALPHABET[i - 3] for i in ids if 3 <= i < 3 + len(ALPHABET))

  def id_to_piece(self, i):
    return '</s>' if i == 1 else ALPHABET[i - 3] if i >= 3 else f'<{i}>'


def _session(kind='encoder_decoder', **decode):
  cfg = ModelConfig(kind=kind, vocab_size=3 + len(ALPHABET), num_encoder_layers=1,
                    num_decoder_layers=2, d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0,
                    max_len=24)
  params = params_of(build_model(cfg, rngs=nnx.Rngs(0)))
  params = jax.tree.map(lambda x: x * 2.0, params)  # peakier, more varied distributions
  settings = dict(beam_size=3, alpha=0.6, max_new_tokens=8, batch_size=4, temperature=1.0, top_k=0)
  config = ml_collections.ConfigDict({'decode': {**settings, **decode}})
  return Session(bind(cfg, params), _Tokenizer(), config, step=0, warn=lambda message: None)


@pytest.fixture(scope='module')
def mt():
  return _session()


LINES = ['a dog runs', '', 'two men', 'x']


def _forced(session, line, tokens):
  source = np.array([session.tokenizer.encode(line)], np.int32)
  return float(forced_log_probs(session.module, source, np.array([tokens], np.int32))[0])


def test_public_names():
  """One front door (`inference.load` -> `Session`); the searches are imported from where they
  live (each row of `autoregressive.strategies`), not re-exported; the modules that only
  aliased them before 0.2.0, and those they moved from, are gone."""
  assert callable(inference.load) and inference.RestoreError
  for name in ('greedy_decode', 'beam_search_decode', 'Translator', 'Session', 'Hypothesis'):
    assert not hasattr(inference, name), name
  for name in ('inference.session', 'model.decoding', 'model.inference', 'model.plotting',
               'model.beam_search', 'model.decode_loop', 'training.restore', 'training.atomic_file',
               'inference.decoding', 'inference.decode_loop', 'inference.beam_search',
               'inference.translator', 'autoregressive.translator', 'inference.scoring',
               'autoregressive.decoding',
               'autoregressive.beam_search', 'autoregressive.decode_loop', 'inference.restore',
               'training.config_io', 'training.checkpoint', 'training.cli', 'training.report'):
    assert importlib.util.find_spec(name) is None, name


def test_nbest_is_best_first_with_consistent_scores(mt):
  found = mt.hypotheses(LINES, nbest=3)
  assert [len(h) for h in found] == [3, 0, 3, 3]  # an empty line has no hypothesis
  assert [h[0].text if h else '' for h in found] == mt.translate(LINES)
  for line, hyps in zip(LINES, found, strict=True):
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
    for h in hyps:  # score = log_prob / GNMT penalty; log_prob = forced decoding's
      penalty = ((5 + len(h.tokens)) / 6) ** 0.6
      np.testing.assert_allclose(h.log_prob, h.score * penalty, rtol=1e-6)
      np.testing.assert_allclose(h.log_prob, _forced(mt, line, h.tokens), rtol=1e-4, atol=1e-4)
      assert h.text == mt.tokenizer.decode(h.tokens)
      assert set(h.as_dict()) == {'text', 'score', 'log_prob', 'tokens'}


def test_greedy_scores_are_the_log_probs(mt):
  (best,), = mt.hypotheses(['two men'], beam_size=1)
  assert best.score == best.log_prob
  np.testing.assert_allclose(best.log_prob, _forced(mt, 'two men', best.tokens), rtol=1e-5)


def test_sampling_is_reproducible_and_independent_of_the_batch(mt):
  settings = dict(nbest=2, strategy='sampling', temperature=1.5, seed=3)
  first = mt.hypotheses(LINES, **settings)
  assert mt.hypotheses(LINES, **settings) == first
  assert [len(h) for h in first] == [2, 0, 2, 2]
  # A line's samples depend on the seed and its line number only, not on its batch.
  alone = mt.hypotheses(['two men'], first_line=3, fixed_rows=False, batch_size=4, **settings)
  assert [h.tokens for h in alone[0]] == [h.tokens for h in first[2]]
  other = mt.hypotheses(LINES, **{**settings, 'seed': 4})
  assert [[h.tokens for h in hs] for hs in other] != [[h.tokens for h in hs] for hs in first]
  for line, hyps in zip(LINES, first, strict=True):
    for h in hyps:  # best first, the model's (untempered) log-probability
      np.testing.assert_allclose(h.log_prob, _forced(mt, line, h.tokens), rtol=1e-5)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_settings_that_do_not_apply_are_refused(mt):
  lm = _session('decoder_only')
  cases = [
      (lambda: mt.hypotheses(['a'], nbest=4), 'nbest=4 is more than the beam size 3'),
      (lambda: mt.translate(['a'], strategy='sampling', beam_size=3),
       'beam_size applies to beam, not to sampling'),
      (lambda: mt.translate(['a'], temperature=0.5), 'temperature applies to sampling, not to'),
      (lambda: mt.translate(['a'], beam_size=1, alpha=0.5), 'alpha applies to beam, not to greedy'),
      (lambda: mt.translate(['a'], strategy='greedy', nbest=2), 'more than greedy decoding'),
      (lambda: mt.translate(['a'], strategy='diverse'), "strategy 'diverse' is not one of"),
      (lambda: mt.translate(['a'], beam=2), r"unknown decoding setting\(s\) \['beam'\]"),
      # Numbers are checked as the flags check them (in the dtype they are used in).
      (lambda: mt.translate(['a'], alpha=float('nan')), r'alpha=nan must be a number in \[0'),
      (lambda: mt.translate(['a'], strategy='sampling', temperature=1e308),
       'temperature=1e[+]308 must be 0 [(]greedy[)] or a number in'),
      (lambda: mt.translate(['a'], strategy='sampling', top_p=1e-40), 'top_p=1e-40 must be'),
      (lambda: mt.translate(['a'], min_new_tokens=9), 'min_new_tokens=9 is more than'),
      (lambda: mt.translate(['a'], batch_size=True), 'batch_size=True must be an integer'),
      (lambda: mt.generate('a'), 'needs a language model'),
      (lambda: lm.generate('a', temperature=float('nan')), 'temperature=nan must be'),
      (lambda: lm.translate(['a']), 'needs a model with a source'),
      (lambda: lm.score(['a'], ['b']), 'needs a model with a source'),
      (lambda: mt.score(['a'], ['b', 'c']), '1 sources but 2 references'),
      (lambda: mt.score(['a'], ['z' * 30]), 'reference line 1 has 31 tokens'),
      # A string where a list of sentences is expected: not one sentence per character.
      (lambda: mt.translate('a dog'), 'lines must be a list of strings'),
      (lambda: mt.hypotheses('a dog', nbest=2), 'lines must be a list of strings'),
      (lambda: mt.score('a', 'b'), 'lines must be a list of strings'),
      # Issue 58, causes 8 and 12: another row's setting, a bool or a string for a number, a
      # lone surrogate, a line that is not a string.
      (lambda: mt.translate(['a'], strategy='greedy', beam_size=4),
       'beam_size applies to beam, not to greedy'),
      (lambda: mt.translate(['a'], beam_size=True), 'beam_size=True must be an integer'),
      (lambda: mt.translate(['a'], max_new_tokens='5'), "max_new_tokens='5' must be an integer"),
      (lambda: mt.translate(['a'], max_new_tokens=0), 'max_new_tokens=0 must be an integer'),
      (lambda: mt.translate(['a \ud800']), 'line 1 is not valid text: surrogates not allowed'),
      (lambda: mt.translate(['a', 3]), 'line 2 is a int'),
  ]
  for call, message in cases:
    with pytest.raises(ValueError, match=message):
      call()
  # A generator of lines is read once, not emptied by the check.
  assert mt.translate(line for line in LINES) == mt.translate(LINES)
  assert mt.translate(['a'], strategy='greedy', beam_size=1) == mt.translate(['a'], beam_size=1)


def test_bad_arguments_of_the_api_and_the_rows_are_one_line_value_errors(mt, tmp_path):
  """Issue 81, causes 17 and 18: these were a TypeError, KeyError, OverflowError,
  IndexError or ZeroDivisionError from deep inside, or silently accepted (an id past the
  vocabulary decoded to nothing; -1 and 3.5 decoded as other ids; top_k ignored at
  temperature 0; a billion tokens asked for; rows made with values no search can take). Each
  is one ValueError line, and the rules are the rows' (where decode.py's flags meet them too),
  checked before anything is read or run."""
  lm = _session('decoder_only')
  rows = strategies.Limits(max_new_tokens=4)
  cases = [
      (lambda: inference.load(b'..'), 'workdir must be a path'),
      (lambda: inference.load(str(tmp_path), average_last='2'),
       r"average_last='2' must be an integer in \[1, 10000\]"),
      (lambda: inference.load(str(tmp_path), mesh='1,1,1'),
       r"mesh='1,1,1' must be None \(one device\) or a jax.sharding.Mesh"),
      (lambda: inference.load(str(tmp_path), step=-1), 'step=-1 must be None'),
      (lambda: mt.translate(None), 'lines must be a list of strings .* got NoneType'),
      (lambda: mt.translate(5), 'lines must be a list of strings .* got int'),
      (lambda: mt.hypotheses(['a'], first_line=-5), r'first_line=-5 must be an integer in \[1, '),
      (lambda: mt.hypotheses(['a'], first_line='a'), "first_line='a' must be an integer"),
      (lambda: mt.search([[2**40]]), r"sources\[0\] has token id 1099511627776, outside the "
                                     r"model's vocabulary \[0, 30\)"),
      (lambda: mt.search(5), 'sources must be a list of token-id sequences'),
      (lambda: mt.search([[3, 1], [30, 1]]), r'sources\[1\] has token id 30, outside'),
      (lambda: mt.search([[-1, 1]]), r'sources\[0\] has token id -1, outside'),
      (lambda: mt.search([[3.5, 1]]), r'sources\[0\] must be token ids .* got float64'),
      (lambda: lm.generate('a', foo=1), r"unknown decoding setting\(s\) \['foo'\]"),
      (lambda: lm.generate('a', line=-1), r'line=-1 must be an integer in \[0, 4294967295\]'),
      (lambda: lm.generate('a', num_tokens=10**9),
       r'num_tokens=1000000000 must be an integer in \[1, 1000000\]'),
      (lambda: lm.generate('a', max_new_tokens=5), 'generate takes no max_new_tokens: num_tokens'),
      (lambda: lm.generate('a', temperature=0, top_k=5),
       'top_k applies to sampling, but the temperature is 0'),
      (lambda: mt.translate(['a'], strategy='sampling', temperature=0, top_k=5),
       'top_k applies to sampling, but the temperature is 0'),
      (lambda: mt.translate(['a'], strategy='sampling', temperature=0, seed=2),
       'seed applies to sampling, but the temperature is 0'),
      # The rows, made directly: checked as when made from settings.
      (lambda: strategies.Limits(max_new_tokens=-1), r'max_new_tokens=-1 must be an integer'),
      (lambda: strategies.Limits(min_new_tokens=9, max_new_tokens=8),
       'min_new_tokens=9 is more than max_new_tokens=8'),
      (lambda: strategies.BeamSearch(beam_size=0), r'beam_size=0 must be an integer in \[1, '),
      (lambda: strategies.Sampling(temperature=-1), 'temperature=-1 must be 0 [(]greedy[)]'),
      # A row's search: an empty batch, ids outside the vocabulary, floats.
      *[(lambda row=row: row().search(mt.module, np.zeros((0, 4), np.int32), limits=rows),
         r'inputs has no rows \(shape \(0, 4\)\)') for row in strategies.TABLE.values()],
      *[(lambda row=row: row().search(mt.module, np.array([[3, 30]]), limits=rows),
         'inputs has token id 30, outside') for row in strategies.TABLE.values()],
      (lambda: strategies.Greedy().search(mt.module, np.array([[3.5, 1]]), limits=rows),
       'inputs must be token ids'),
      (lambda: strategies.Sampling().search(mt.module, 5, limits=rows), 'inputs must be token ids'),
  ]
  for call, message in cases:
    with pytest.raises(ValueError, match=message) as caught:
      call()
    assert '\n' not in str(caught.value), caught.value
  assert not os.listdir(tmp_path)  # nothing read or written there
  # At temperature 0 the config's own top_k is no refusal (lm_1b's config has 40): greedy.
  greedy = _session('decoder_only', temperature=0.0, top_k=40)
  assert greedy.generate('ab', num_tokens=3) == greedy.generate('ab', num_tokens=3,
                                                                temperature=0)


def test_max_new_tokens_beyond_the_models_positions_is_capped_with_one_warning(mt):
  """No output is longer than the model's max_len positions: a larger max_new_tokens is capped
  there, with a warning (`strategies.fit_to_positions`, the one cap of the Session, decode.py's
  checks and the trainer's evaluation); a min_new_tokens above the cap is refused."""
  said = []
  session = Session(mt.module, mt.tokenizer, mt.config, step=0, warn=said.append)
  _, limits = session.settings(max_new_tokens=1000)
  assert limits.max_new_tokens == mt.module.config.max_len == 24
  assert said == ["max_new_tokens 1000 is more than the model's max_len 24; using 24"]
  assert session.settings(max_new_tokens=24)[1].max_new_tokens == 24 and len(said) == 1
  assert strategies.fit_to_positions('many', 24) == ('many', False)  # the checks name it
  with pytest.raises(ValueError, match='min_new_tokens=30 is more than'):
    session.settings(max_new_tokens=1000, min_new_tokens=30)


def test_score_references_is_forced_decoding(mt):
  sources, references = ['a dog runs', '', 'two men'], ['ein hund', 'x', 'zwei']
  scores = mt.score(sources, references)
  assert scores[1] is None  # an empty source line
  for i in (0, 2):
    assert scores[i] == pytest.approx(
        _forced(mt, sources[i], mt.tokenizer.encode(references[i])), rel=1e-5)


def test_score_references_on_two_workers_with_one_target_length_per_source_length(mt,
                                                                                monkeypatch):
  """Batches run two at a time, scores in order; the batches whose sources pad to one length
  pad their targets to one length too (one program per source length, not per pair)."""
  from autoregressive import scoring  # pylint: disable=import-outside-toplevel
  encode = mt.tokenizer.encode
  sources = [encode(s) for s in ('a dog', 'two men run', 'a', 'the cat sat')]
  targets = [encode(t) for t in ('ein hund', 'zwei maenner laufen', 'x', 'die')]
  one = scoring.score_references(mt.module, sources, targets, batch_size=1, workers=1)
  shapes, forced = [], scoring.forced_log_probs

  def recording(model, inputs, padded):
    shapes.append((inputs.shape, padded.shape))
    return forced(model, inputs, padded)

  monkeypatch.setattr(scoring, 'forced_log_probs', recording)
  two = scoring.score_references(mt.module, sources, targets, batch_size=1, workers=2)
  assert two == one
  assert set(shapes) == {((1, 16), (1, 24))}  # targets of 9, 20, 2 and 4 tokens; max_len 24
  for i in range(4):  # each pair alone, unpadded
    alone = forced(mt.module, np.array([sources[i]]), np.array([targets[i]]))[0]
    assert one[i] == pytest.approx(float(alone), rel=1e-5)


def test_generate_continues_the_prompt():
  lm = _session('decoder_only', temperature=0.0)
  text = lm.generate('ab', num_tokens=6)
  assert text.startswith('ab') and lm.generate('ab', num_tokens=6) == text
  assert lm.generate('ab', num_tokens=6, include_prompt=False) == text[2:]
  ids, new = lm.generate_ids('ab', num_tokens=6)
  assert ids == [3, 4] and 0 < len(new) <= 6  # the prompt's EOS is dropped: it continues
  sampled = {lm.generate('ab', num_tokens=6, temperature=1.0, seed=s) for s in range(4)}
  assert len(sampled) > 1
  # Each (seed, line) pair has its own stream: line 1 at seed 0 is not line 0 at seed 1.
  streams = {(s, n): lm.generate('ab', num_tokens=8, temperature=1.0, seed=s, line=n)
             for s, n in ((0, 0), (0, 1), (1, 0), (1, 1))}
  assert streams[0, 1] != streams[1, 0] and len(set(streams.values())) == 4


def _pipe_reader():
  read, write = os.pipe()
  return streaming.LineReader(os.fdopen(read, 'rb')), os.fdopen(write, 'wb')


def _next_within(iterator, seconds=60):
  """next(iterator), failing (instead of hanging the suite) if it has not come in `seconds`."""
  box = []

  def take():
    try:
      box.append(next(iterator, 'END'))
    except Exception as e:  # noqa: BLE001  # raised again in the test's thread
      box.append(e)
  thread = threading.Thread(target=take, daemon=True)
  thread.start()
  thread.join(seconds)
  assert box, 'the reader waited for more input than the line it had'
  if isinstance(box[0], Exception):
    raise box[0]
  return box[0]


def test_line_reader_gives_each_line_without_waiting_for_more():
  reader, pipe = _pipe_reader()
  batches = reader.batches(limit=8)
  pipe.write(b'first line\r\n')
  pipe.flush()
  assert _next_within(batches) == (0, ['first line'])  # the pipe is still open
  pipe.write(b'\nthird\n')
  pipe.flush()
  got = _next_within(batches)
  lines = got[1] if got[1] == ['', 'third'] else got[1] + _next_within(batches)[1]
  assert lines == ['', 'third'] and got[0] == 1
  pipe.write(b'ok\n\xff bad\n')
  pipe.close()
  with pytest.raises(streaming.InputError, match=r'input <stdin> line 5 is not valid UTF-8'):
    while _next_within(batches) != 'END':
      pass


def test_output_formats():
  hyps = [strategies.Hypothesis([5, 1], -0.5, -0.75, 'a\nb'),
          strategies.Hypothesis([6, 1], -1.0, -1.5, 'c')]
  assert streaming.format_hypotheses(3, 'src', hyps, 'text', 1) == 'a b\n'
  assert streaming.format_hypotheses(3, 'src', [], 'text', 1) == '\n'
  assert (streaming.format_hypotheses(3, 'src', hyps, 'text', 2)
          == '3\t-0.5000\ta b\n3\t-1.0000\tc\n')
  line = streaming.format_hypotheses(3, 'src', hyps, 'jsonl', 2)
  assert line.endswith('\n') and line.count('\n') == 1
  assert json.loads(line) == {'source': 'src', 'hypotheses': [
      {'text': 'a\nb', 'score': -0.5, 'log_prob': -0.75, 'tokens': [5, 1]},
      {'text': 'c', 'score': -1.0, 'log_prob': -1.5, 'tokens': [6, 1]}]}
  assert streaming.format_reference_score('s', 'r', [4, 1], -2.5, 'text') == '-2.5000\tr\n'
  assert streaming.format_reference_score('', 'r', [], None, 'text') == '\n'
  assert json.loads(streaming.format_reference_score('s', 'r', [4, 1], -2.5, 'jsonl')) == {
      'source': 's', 'reference': 'r', 'log_prob': -2.5, 'tokens': [4, 1]}
  assert streaming.format_generation('a\nb', 'c\n', [1], 'text') == 'a\nbc\n\n'
  # Every character a reader may take as a line break is a space in a translation's line.
  breaks = '\r\n \n \r \x0b \x0c \x1c \x1d \x1e \x85 \u2028 \u2029'
  odd = [strategies.Hypothesis([5, 1], -0.5, -0.5, f'a{c}b') for c in breaks.split(' ')]
  out = ''.join(streaming.format_hypotheses(i, 's', [h], 'text', 1) for i, h in enumerate(odd))
  assert out.splitlines() == ['a b'] * len(odd) and out.count('\n') == len(odd)
  nbest = streaming.format_hypotheses(0, 's', odd, 'text', len(odd))
  assert len(nbest.splitlines()) == len(odd)
  assert streaming.format_reference_score('s', 'r\x1ds', [4, 1], -2.5, 'text') == '-2.5000\tr s\n'


def test_attention_plots_have_token_labels_and_report_progress(mt, tmp_path):
  from inference import plotting  # pylint: disable=import-outside-toplevel
  tok = mt.tokenizer
  items = [(0, tok.encode('a dog'), tok.encode('ein hund')), (4, tok.encode('x'), [5, 1])]
  done = []
  written = plotting.plot_lines(mt.module, tok.id_to_piece, items, str(tmp_path),
                                heads='average', progress=done.append)
  # Per sentence: the overview, then the head average of 1 encoder and 2 x 2 decoder modules.
  assert done == [1, 1] and written == 2 * (1 + 1 + 2 * 2)
  names = sorted(os.listdir(tmp_path / 'line_00005'))
  assert 'overview.png' in names and 'decoder_layer_1_cross_attention_average.png' in names
  # The overview's average column carries the tokens: queries on the left, keys below.
  maps = plotting.collect_attention(mt.module, np.array([items[0][1]]),
                                    np.array([items[0][2]]))
  pieces = lambda ids: [tok.id_to_piece(i) for i in ids]  # noqa: E731
  panels = list(plotting._panels(maps, 0, pieces(items[0][1]), pieces(items[0][2])))
  fig = plotting._overview_figure(panels, 'line 1')
  cross = [ax for ax in fig.axes if 'cross' in ax.get_ylabel()][0]
  assert [t.get_text() for t in cross.get_xticklabels()] == pieces(items[0][1])
  assert [t.get_text() for t in cross.get_yticklabels()] == pieces(items[0][2])
  decoder_self = [ax for ax in fig.axes if 'decoder\nlayer_0\nself' in ax.get_ylabel()][0]
  assert [t.get_text() for t in decoder_self.get_xticklabels()] == ['<s>'] + pieces(
      items[0][2])[:-1]


def test_a_typo_in_config_json_decode_section_is_refused(workdirs, tmp_path):
  """Issue 58, cause 12: the model section refused an unknown field, the decode section
  ignored one ("beam_szie": 8 ran beam 2)."""
  import shutil  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / 'mt'
  shutil.copytree(workdirs['mt'], workdir)
  config = json.loads((workdir / 'config.json').read_text())
  config['decode']['beam_szie'] = 8
  (workdir / 'config.json').write_text(json.dumps(config))
  with pytest.raises(inference.RestoreError) as caught:
    inference.load(str(workdir))
  assert str(caught.value) == (f'{workdir}/config.json: config.decode has unknown field(s) '
                               "['beam_szie']; did you mean config.decode.beam_size?")
