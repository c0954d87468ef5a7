"""CTranslate2 export: `ctranslate2.Translator` / `Generator` compute our model (random tiny
models, every variant CTranslate2 can express) and decode as decode.py does (a trained
Multi30k model: greedy and beam 4 on test2016, identical tokens).

Our decoding never emits `<pad>`; the export gives it a -1e9 output bias, so CTranslate2
normalises over the vocabulary without it. Log-probabilities are therefore compared with ours
renormalised without `<pad>` (the same function), logits directly.
"""

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from autoregressive.strategies.greedy import greedy_decode
from configs import default, shakespeare_char
from hf_export import UnsupportedConfig, convert, ctranslate2 as ct2_export
from input_pipeline.tokenizers import CharTokenizer
from model import build_model
from tests import REPO, beam_reference, export_workdirs, extras

ctranslate2 = extras.require('ctranslate2')  # the [ct2] extra, which [test] includes

CHARS = export_workdirs.CHARS
TOKENIZER = CharTokenizer(CHARS)  # ids 1..44; the models below have 3 more (unused) ids


def _save(tmp_path, params, module, tokenizer=TOKENIZER):
  spec = ct2_export.model_spec(params, module.config, tokenizer)
  spec.optimize(quantization=None)
  spec.save(str(tmp_path))
  return str(tmp_path)


def _log_probs_without_pad(logits):
  """log-softmax over ids 1.. (our logits `[..., vocab]` with `<pad>` left out)."""
  return np.asarray(jax.nn.log_softmax(np.asarray(logits)[..., 1:]))


# norm_position, share_embeddings, logits_via_embedding, activation, positions: each value of
# each flag once (the spec sets each from its own flag: pre_norm, shared embeddings, a separate
# projection, the activation, the position table), so no pair needs a case of its own.
ENCODER_DECODER = [('post', True, True, 'relu', 'sinusoidal'),
                   ('pre', True, False, 'gelu', 'learned'), ('pre', False, True, 'relu', 'rope')]


@pytest.mark.parametrize('norm,share,tied,activation,positions', ENCODER_DECODER)
def test_translator_scores_equal_ours(tmp_path, norm, share, tied, activation, positions):
  config = export_workdirs.two_layer_translation_config()
  config.update(norm_position=norm, share_embeddings=share, logits_via_embedding=tied,
                activation=activation, positional_encoding=positions,
                vocab_size=len(CHARS) + 4, scale_embeddings=norm == 'post')
  module, params = export_workdirs.random_model(config)
  translator = ctranslate2.Translator(_save(tmp_path, params, module), intra_threads=1)
  sources, targets = ['ROSE: his tale', 'a'], ['Rosen tale.', 'and then some more']
  inputs = np.zeros((2, 16), np.int32)
  outputs = np.zeros((2, 20), np.int32)
  for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
    inputs[row, :len(s)], outputs[row, :len(t)] = TOKENIZER.encode(s), TOKENIZER.encode(t)
  ours = _log_probs_without_pad(module(inputs, outputs))
  results = translator.score_batch([list(s) for s in sources], [list(t) for t in targets])
  for row, (result, target) in enumerate(zip(results, targets, strict=True)):
    theirs = result.log_probs[:-1]  # the last is their end token (none here: <unk>, -1e9)
    expected = ours[row, np.arange(len(target)), outputs[row, :len(target)] - 1]
    np.testing.assert_allclose(theirs, expected, atol=2e-5, rtol=0)


DECODER_ONLY = [('pre', 'learned', True, 'gelu'), ('pre', 'sinusoidal', False, 'relu'),
                ('post', 'rope', True, 'relu')]


@pytest.mark.parametrize('norm,positions,tied,activation', DECODER_ONLY)
def test_generator_logits_and_greedy_equal_ours(tmp_path, norm, positions, tied, activation):
  config = shakespeare_char.get_config('tiny').model
  config.update(norm_position=norm, positional_encoding=positions, logits_via_embedding=tied,
                activation=activation, vocab_size=len(CHARS) + 1)
  module, params = export_workdirs.random_model(config)
  generator = ctranslate2.Generator(_save(tmp_path, params, module), intra_threads=1)
  prompt = 'ROSE: his tale'
  ids = TOKENIZER.encode(prompt)
  theirs = np.asarray(generator.forward_batch([['<pad>'] + list(prompt)]))[0, :-1]
  ours = np.asarray(module(np.array([ids])))[0]
  np.testing.assert_allclose(theirs[:, 1:config.vocab_size], ours[:, 1:], atol=2e-5, rtol=0)
  assert (theirs[:, 0] == convert.NEVER).all()  # <pad> is never generated

  # Greedy continuation with the options export_info.json lists, as our greedy decoding.
  options = ct2_export.decoding_options(module.config, TOKENIZER, {})['generate_batch']
  n = config.max_len - len(ids)  # the start token, the prompt and n - 1 fed-back tokens
  options = {**options, 'max_length': n}
  result = generator.generate_batch([['<pad>'] + list(prompt)], **options)[0]
  greedy = greedy_decode(module, prompt=np.array([ids], np.int32),
                         max_new_tokens=n, eos_id=None)
  # The same tokens, but where a float near-tie decides (another CPU may break it otherwise).
  generated = TOKENIZER.encode(''.join(result.sequences[0]))
  beam_reference.greedy_difference_is_a_tie(
      [*ids, *np.asarray(greedy)[0].tolist()], [*ids, *generated],
      beam_reference.model_next_log_probs(module, None, config.max_len, 1))
  if positions != 'rope':  # past its positions it stops with a message naming the limit
    with pytest.raises(RuntimeError, match=f'positions >= {config.max_len}'):
      generator.generate_batch([['<pad>'] + list(prompt)], **{**options, 'max_length': n + 1})


def test_encoder_only_is_refused():
  config = default.get_config('tiny').model
  config.kind = 'encoder_only'
  with pytest.raises(UnsupportedConfig, match='kind=encoder_only'):
    ct2_export.check(build_model(config).config)


# ----------------------------------------------------------------------------- trained model

@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """(workdir, CTranslate2 export of its newest checkpoint) through the command line."""
  workdir = export_workdirs.trained(tmp_path_factory, 'mt')
  out = str(tmp_path_factory.mktemp('export_ct2') / 'ct2')
  proc = subprocess.run([sys.executable, os.path.join(REPO, 'export.py'), f'--workdir={workdir}',
                         f'--output_dir={out}', '--format=ctranslate2'], cwd=REPO,
                        env=export_workdirs.env(), capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 0, proc.stderr
  assert 'CTranslate2 Translator' in proc.stderr.strip().splitlines()[-1]
  return workdir, out


def _test_lines(n, tokenizer):
  """The first `n` test2016 lines, the last replaced by the longest line (cut to max_len)."""
  with gzip.open(os.path.join(REPO, 'data', 'multi30k', 'test_2016_flickr.en.gz'), 'rt',
                 encoding='utf-8') as f:
    lines = f.read().splitlines()
  return lines[:n - 1] + [max(lines, key=lambda line: len(tokenizer.encode(line)))]


def test_trained_export_decodes_as_decode_py(exported):
  import sentencepiece

  import inference  # the front door decode.py goes through

  workdir, out = exported
  with open(os.path.join(out, 'export_info.json'), encoding='utf-8') as f:
    info = json.load(f)
  assert info['format'] == 'ctranslate2' and info['written_by'] == 'export.py'
  restored = inference.load(workdir, warn=lambda message: None)
  max_len = restored.module.config.max_len
  lines = _test_lines(30, restored.tokenizer)
  assert len(restored.tokenizer.encode(lines[-1])) > max_len
  sources = restored.encode(lines)
  sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, 'spm.model'))
  pieces = [sp.encode(line, out_type=str) for line in lines]
  translator = ctranslate2.Translator(out, intra_threads=1)
  options = info['ctranslate2']['translate_batch']
  assert options['max_input_length'] == max_len and options['length_penalty'] == 0
  assert options['min_decoding_length'] == 1
  ours, ties = {}, 0
  # Greedy and the README's beam: beam 2 is the same search with another k (compared with the
  # near-tie rule in test_beam_vs_ctranslate2, and on this model in test_decode_engines_bench).
  for beam in sorted({1, 4, options['beam_size']}):
    penalty = {} if beam == 1 else {'alpha': 0.0}  # greedy has no length penalty
    ours[beam] = [h[0].tokens for h in restored.search(
        sources, beam_size=beam, batch_size=16, scores=False, **penalty,
        max_new_tokens=options['max_decoding_length'])]
    results = translator.translate_batch(pieces, **{**options, 'beam_size': beam})
    theirs = [[sp.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    assert all(theirs) and all(o and o != [1] for o in ours[beam])  # no empty translation

    def reference(i, beam=beam):  # the rule in NumPy, on our model
      search = beam_reference.model_next_log_probs(
          restored.module, sources[i], options['max_decoding_length'], beam)
      return beam_reference.beam_search(search, k=beam,
                                        max_new_tokens=options['max_decoding_length'])
    # The same translations, but where float rounding decides a near tie (< 1e-3 nats).
    ties += beam_reference.differences_are_ties(ours[beam], theirs, reference)
  assert ties <= 1
  assert sum(o[-1] == 1 for o in ours[4]) >= 20  # most end with EOS before the length limit

  # The README's lines, as printed, on this export.
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    readme = f.read()
  blocks = re.findall(r'^( *)```python\n(.*?)^\1```', readme, re.DOTALL | re.MULTILINE)
  code = [textwrap.dedent(c) for _, c in blocks if 'ctranslate2.Translator' in c][0]
  printed = []
  exec(code.replace('runs/default_ct2', out).replace("'A man is riding a bike.'",  # noqa: S102
                                                     repr(lines[-1])), {'print': printed.append})
  assert printed == [restored.tokenizer.decode(ours[options['beam_size']][-1])]


# ----------------------------------------------------------------------------- long lines

LONG = 'a man is riding a bike. ' * 60  # 1440 characters: CTranslate2 cuts it to 1024


def _long_sentence(words=180):
  """test2016 lines joined until they make a ~`words`-word line, far past max_len pieces."""
  with gzip.open(os.path.join(REPO, 'data', 'multi30k', 'test_2016_flickr.en.gz'), 'rt',
                 encoding='utf-8') as f:
    lines = iter(f.read().splitlines())
  line = ''
  while len(line.split()) < words:
    line = f'{line} {next(lines)}'.strip()
  return line


def test_default_options_translate_a_long_line(exported):
  """CTranslate2's defaults (max_input_length=1024, max_decoding_length=256) on a line past
  max_len: the sinusoidal table covers them, so it translates instead of failing."""
  import sentencepiece

  _, out = exported
  sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, 'spm.model'))
  with open(os.path.join(out, 'export_info.json'), encoding='utf-8') as f:
    max_len = json.load(f)['max_len']
  line = _long_sentence()
  assert len(sp.encode(line)) > 3 * max_len
  translator = ctranslate2.Translator(out, intra_threads=1)
  short = sp.encode('A man is riding a bike.', out_type=str)
  result = translator.translate_batch([sp.encode(line, out_type=str), short])
  assert result[0].hypotheses[0]
  # Padded beside a line 3x past max_len, the short line translates as it does alone.
  assert result[1].hypotheses[0] == translator.translate_batch([short])[0].hypotheses[0]


@pytest.mark.parametrize('positions', ['sinusoidal', 'learned', 'rope'])
def test_translator_positions_past_max_len(tmp_path, positions):
  """Default options on a line past every limit: sinusoidal and rotary positions run (the table
  holds CTranslate2's 1024 default input positions, within max_len unchanged; rotary has none);
  a learned table has max_len rows and stops with CTranslate2's message naming that limit (the
  README), unless export_info.json's options cut the input and output at max_len."""
  from model import attention as attn

  config = default.get_config('tiny').model
  config.update(positional_encoding=positions, vocab_size=len(CHARS) + 4)
  module, params = export_workdirs.random_model(config)
  max_len = module.config.max_len
  spec = ct2_export.model_spec(params, module.config, TOKENIZER)
  for stack in (spec.encoder, spec.decoder):
    table = getattr(getattr(stack, 'position_encodings', None), 'encodings', None)
    table = table.numpy() if hasattr(table, 'numpy') else None  # validate() wraps arrays
    if positions == 'sinusoidal':
      assert len(table) >= 1024
      np.testing.assert_array_equal(table[:max_len],
                                    np.asarray(attn.sinusoidal_positions(max_len, config.d_model)))
    elif positions == 'learned':
      assert len(table) == max_len
  translator = ctranslate2.Translator(_save(tmp_path, params, module), intra_threads=1)
  options = ct2_export.decoding_options(module.config, TOKENIZER, {})['translate_batch']
  assert translator.translate_batch([list(LONG)], **options)[0].hypotheses[0]
  if positions == 'learned':
    with pytest.raises(RuntimeError, match=f'positions >= {max_len}'):
      translator.translate_batch([list(LONG)])
  else:  # a random model never ends: 256 target positions, and 1024 source ones
    result = translator.translate_batch([list(LONG)], beam_size=1)[0]
    assert len(result.hypotheses[0]) == 256
