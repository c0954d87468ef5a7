"""Hugging Face export: `transformers` (PyTorch, CPU) computes our logits, tokenizer ids and
beam search; configs no target class can express are refused.

Tolerances: Marian/Pegasus hard-code LayerNorm epsilon 1e-5 where ours is 1e-6 (GPT-2's is a
config field), so their logits are compared at 1e-4 as exported, and at 1e-5 (float32
rounding) once the epsilon of the loaded torch modules is set to ours: the epsilon is then the
only difference left.
"""

import gzip
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from autoregressive.strategies import BeamSearch, Limits
from autoregressive.strategies.greedy import greedy_decode
from configs import default, shakespeare_char
from hf_export import UnsupportedConfig, check_exportable, writer
from input_pipeline.tokenizers import CharTokenizer
from model import build_model
from model.build import with_options
from model.layers import LAYER_NORM_EPS
from model.stacks import stack_layer_params
from tests import REPO, beam_reference, export_workdirs, extras

torch = extras.require('torch')  # the [hf] extra, which [test] includes
transformers = extras.require('transformers')

DATA = os.path.join(REPO, 'data', 'multi30k')
DECODE = {'beam_size': 4, 'alpha': 0.0, 'max_new_tokens': 16, 'temperature': 1.0, 'top_k': 0}
CHARS = export_workdirs.CHARS  # 44 characters: ids 1..44


def _env():
  env = dict(os.environ)
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  env.setdefault('JAX_PLATFORMS', 'cpu')
  return env


def _load(directory, cls, eps=None):
  model, info = cls.from_pretrained(directory, output_loading_info=True)
  problems = {k: v for k, v in info.items() if v}
  assert not problems, f'the export does not fill the class exactly: {problems}'
  if eps is not None:
    for m in model.modules():
      if isinstance(m, torch.nn.LayerNorm):
        m.eps = eps
  return model.eval()


def _padded_batch(rng, vocab, rows, length, lengths):
  ids = rng.integers(3, vocab, (rows, length))
  for row, n in enumerate(lengths):
    ids[row, n:] = 0
  return ids


def _hf_seq2seq_logits(model, inputs, targets):
  """Teacher-forced logits `[batch, tgt_len, vocab - 1]` with our shift (start token 0), pad's
  column left out: the export's output bias puts it at -1e9 (never generated)."""
  decoder_inputs = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(inputs > 0),
                   decoder_input_ids=torch.tensor(decoder_inputs),
                   decoder_attention_mask=torch.tensor(targets > 0)).logits.numpy()
  assert (logits[..., 0] < -1e8).all()
  return logits[..., 1:]


# norm_position, share_embeddings, logits_via_embedding, activation. Each value of each flag on
# each class (Marian: post; Pegasus: pre, which needs shared embeddings): the converter treats
# the flags one by one (shared embedding, separate lm_head, activation name), so no pair of
# them needs a case of its own.
SEQ2SEQ = [('post', True, True, 'relu'), ('post', False, False, 'gelu'),
           ('pre', True, True, 'gelu'), ('pre', True, False, 'relu')]


@pytest.mark.parametrize('norm,share,tied,activation', SEQ2SEQ)
def test_encoder_decoder_logits_equal(tmp_path, norm, share, tied, activation):
  config = export_workdirs.two_layer_translation_config()
  config.norm_position, config.share_embeddings = norm, share
  config.logits_via_embedding, config.activation = tied, activation
  module, params = export_workdirs.random_model(config)
  arch, _ = writer.write_export(str(tmp_path), params, module.config, CharTokenizer(CHARS), DECODE)
  assert arch == {'post': 'MarianMTModel', 'pre': 'PegasusForConditionalGeneration'}[norm]
  rng = np.random.default_rng(0)
  inputs = _padded_batch(rng, config.vocab_size, 4, 13, [13, 7, 1, 10])
  targets = _padded_batch(rng, config.vocab_size, 4, 11, [11, 4, 9, 1])
  ours = np.asarray(module(inputs, targets))[..., 1:]
  valid = targets > 0  # our logits at padded target positions are not defined the same way
  cls = getattr(transformers, arch)
  theirs = _hf_seq2seq_logits(_load(tmp_path, cls), inputs, targets)
  # Marian's hard-coded LayerNorm epsilon (1e-5, ours 1e-6) moves these logits by ~1e-4 (1.13e-4
  # seen once in CI on a post-norm gelu case); the exact check is the same-epsilon one below.
  np.testing.assert_allclose(theirs[valid], ours[valid], atol=2e-4, rtol=0)
  same_eps = _hf_seq2seq_logits(_load(tmp_path, cls, eps=LAYER_NORM_EPS), inputs, targets)
  np.testing.assert_allclose(same_eps[valid], ours[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize('positions,activation', [('learned', 'gelu'), ('sinusoidal', 'relu')])
def test_decoder_only_logits_and_greedy_equal(tmp_path, positions, activation):
  config = shakespeare_char.get_config('tiny').model
  config.vocab_size = len(CHARS) + 1
  config.positional_encoding, config.activation = positions, activation
  module, params = export_workdirs.random_model(config)
  arch, _ = writer.write_export(str(tmp_path), params, module.config, CharTokenizer(CHARS), DECODE)
  assert arch == 'GPT2LMHeadModel'
  model = _load(tmp_path, transformers.GPT2LMHeadModel)
  tokens = _padded_batch(np.random.default_rng(1), config.vocab_size, 3, 20, [20, 12, 1])
  ours = np.asarray(module(tokens))
  with torch.no_grad():  # GPT-2 reads our decoder input: the start token 0, then the text
    theirs = model(input_ids=torch.tensor(np.pad(tokens, ((0, 0), (1, 0)))[:, :-1]),
                   attention_mask=torch.tensor(tokens > 0)).logits.numpy()
  np.testing.assert_allclose(theirs[tokens > 0], ours[tokens > 0], atol=1e-5, rtol=0)
  # Greedy continuation of a prompt through transformers' own tokenizer and generate().
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
  prompt = 'ROSE: his tale'
  ids = tokenizer(prompt)['input_ids']
  assert ids == [0] + CharTokenizer(CHARS).encode(prompt)
  ours = greedy_decode(module, prompt=np.array([ids[1:]], np.int32),
                       max_new_tokens=12, eos_id=None)
  # The tokenizer's attention mask keeps the start token: it is id 0, which is also pad.
  theirs = model.generate(**tokenizer([prompt], return_tensors='pt'), do_sample=False,
                          max_new_tokens=12)
  # The same tokens, but where a float near-tie decides (another CPU may break it otherwise).
  mine = np.asarray(ours)[0].tolist()
  beam_reference.greedy_difference_is_a_tie(
      [*ids[1:], *mine], [*ids[1:], *theirs[0, len(ids):].tolist()],
      beam_reference.model_next_log_probs(module, None, config.max_len, 1))
  # GPT-2 has max_len positions (the start token, the prompt, the new tokens; README):
  # generate() stops there by default, and asked for more it fails (after transformers'
  # warning naming the limit) instead of continuing in windows as decode.py does.
  full = model.generate(**tokenizer([prompt], return_tensors='pt'), do_sample=False)
  assert full.shape[1] == config.max_len
  with pytest.raises(IndexError):
    model.generate(**tokenizer([prompt], return_tensors='pt'), do_sample=False,
                   max_new_tokens=config.max_len)


@pytest.mark.parametrize('preset', [default, shakespeare_char])
def test_scanned_and_string_keyed_layers_convert_as_unrolled(preset):
  """`convert.layers_of` reads the params of a scan_layers model (leaves `[num_layers, ...]`)
  and layer indices stored as strings (`layers/'0'`) as the unrolled `layers/0`."""
  config = (export_workdirs.two_layer_translation_config() if preset is default
            else preset.get_config('tiny').model)
  config.norm_position, config.vocab_size = 'pre', len(CHARS) + 1
  module, params = export_workdirs.random_model(config)
  state_dict = writer.convert_params(params, module.config)
  named = {k: {**v, 'layers': {str(i): layer for i, layer in v['layers'].items()}}
           if isinstance(v, dict) and 'layers' in v else v for k, v in params.items()}
  for other in (stack_layer_params(params), named):
    converted = writer.convert_params(other, module.config)
    assert converted.keys() == state_dict.keys()
    for name, array in converted.items():
      np.testing.assert_array_equal(array, state_dict[name], err_msg=name)


def test_char_tokenizer_round_trip(tmp_path):
  with open(os.path.join(REPO, 'data', 'tinyshakespeare', 'input.txt'), encoding='utf-8') as f:
    text = f.read(3000)
  ours = CharTokenizer(sorted(set(text)))
  config = shakespeare_char.get_config('tiny').model
  config.vocab_size = ours.vocab_size
  module, params = export_workdirs.random_model(config)
  writer.write_export(str(tmp_path), params, module.config, ours, DECODE)
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
  sample = text[1000:1400]  # newlines, double spaces, punctuation
  assert theirs(sample)['input_ids'] == [0] + ours.encode(sample)
  assert theirs.decode(theirs(sample)['input_ids'], skip_special_tokens=True) == sample
  with pytest.raises(Exception, match='UNK|unk|Unk'):  # as ours: no silent unknown character
    theirs('~ not in the vocabulary ~')


BERT_LIKE = {'embedding_norm': True, 'positional_encoding': 'learned', 'scale_embeddings': False}
REFUSED = [
    ('encoder_decoder', {'positional_encoding': 'learned'}, 'positional_encoding=learned'),
    ('encoder_decoder', {'positional_encoding': 'rope'}, 'positional_encoding=rope'),
    ('encoder_decoder', {'norm_position': 'pre', 'share_embeddings': False}, 'share_embeddings'),
    ('decoder_only', {'norm_position': 'post'}, 'norm_position=post'),
    ('decoder_only', {'positional_encoding': 'rope'}, 'positional_encoding=rope'),
    ('decoder_only', {'logits_via_embedding': False}, 'logits_via_embedding=False'),
    ('encoder_only', {}, 'embedding_norm=False (encoder_only)'),  # BertModel's conditions
    ('encoder_only', {'embedding_norm': True}, 'positional_encoding=sinusoidal (encoder_only)'),
    ('encoder_only', BERT_LIKE | {'scale_embeddings': True}, 'scale_embeddings=True'),
    ('encoder_only', BERT_LIKE | {'norm_position': 'pre'}, 'norm_position=pre (encoder_only)'),
]


@pytest.mark.parametrize('kind,changes,named', REFUSED)
def test_inexpressible_configs_are_refused(kind, changes, named):
  preset = shakespeare_char if kind == 'decoder_only' else default
  config = preset.get_config('tiny').model
  config.kind = kind
  config.update(changes)
  with pytest.raises(UnsupportedConfig, match=re.escape(named)) as caught:
    check_exportable(build_model(config).config)
  assert '\n' not in str(caught.value)


@pytest.mark.parametrize('tokenizer', ['sentencepiece', 'char'])
def test_an_encoder_without_its_imported_tokenizer_is_refused(tokenizer):
  """BertModel is written only with the tokenizer a BERT import came with ('huggingface')."""
  config = default.get_config('tiny').model
  config.update(kind='encoder_only', **BERT_LIKE)
  check_exportable(build_model(config).config, 'huggingface')
  with pytest.raises(UnsupportedConfig, match=re.escape(
      f'config.data.tokenizer={tokenizer} with kind=encoder_only cannot be exported: the '
      f'exporter writes no {tokenizer} tokenizer for BertModel')) as caught:
    check_exportable(build_model(config).config, tokenizer)
  assert '\n' not in str(caught.value)


# ----------------------------------------------------------------------------- trained model

@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A small Multi30k model trained to write real (EOS-ended) sentences, 2 checkpoints
  (shared with the other export tests: `export_workdirs`)."""
  return export_workdirs.trained(tmp_path_factory, 'mt')


def _export(*args):
  return subprocess.run([sys.executable, os.path.join(REPO, 'export.py'), *args], cwd=REPO,
                        env=_env(), capture_output=True, text=True, check=False)


@pytest.fixture(scope='module')
def exported(trained, tmp_path_factory):
  """(directory, summary line): the average of `trained`'s last 2 checkpoints exported in a
  test process (`export_workdirs.exported_hf`, shared with test_import_hf), not by export.py:
  its main only parses its flags into the same call and prints the summary, and its whole run
  (exit 0, the summary line) is test_export_ct2's `exported`."""
  del trained  # the workdir exported_hf exports
  return export_workdirs.exported_hf(tmp_path_factory)


def _until_eos(ids):
  """Generated ids up to and including EOS (1): transformers pads the shorter rows."""
  return ids[:ids.index(1) + 1] if 1 in ids else ids


def _sentences(n=None):
  """The first `n` test2016 source lines (all of them when None)."""
  with gzip.open(os.path.join(DATA, 'test_2016_flickr.en.gz'), 'rt', encoding='utf-8') as f:
    lines = f.read().splitlines()
  return lines if n is None else lines[:n]


def test_trained_export_translates_as_decode_py(trained, exported):
  import inference  # the front door decode.py goes through

  out, summary = exported
  assert 'MarianMTModel' in summary and '\n' not in summary
  assert {'config.json', 'model.safetensors', 'source.spm', 'vocab.json'} <= set(os.listdir(out))
  restored = inference.load(trained, average_last=2, warn=lambda message: None)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  lines = _sentences(8)
  assert [tokenizer(line)['input_ids'] for line in lines] == list(map(restored.tokenizer.encode,
                                                                       lines))
  # Short lines and the longest test2016 line, which the tokenizer cuts as decode.py does.
  longest = max(_sentences(), key=lambda line: len(restored.tokenizer.encode(line)))
  assert len(restored.tokenizer.encode(longest)) > restored.module.config.max_len
  lines = [line for line in lines if len(restored.tokenizer.encode(line)) <= 48][:5] + [longest]
  sources = restored.encode(lines)
  model = _load(out, transformers.AutoModelForSeq2SeqLM)

  # Logits on a padded batch of real sentences.
  inputs = np.zeros((len(lines), max(map(len, sources))), np.int64)
  for row, ids in enumerate(sources):
    inputs[row, :len(ids)] = ids
  targets = np.roll(inputs, 2, axis=0)[:, :20]
  ours = np.asarray(restored.module(inputs, targets))[..., 1:]
  theirs = _hf_seq2seq_logits(model, inputs, targets)
  np.testing.assert_allclose(theirs[targets > 0], ours[targets > 0], atol=1e-4, rtol=0)

  # Beam 4 with no length penalty: the same search (docs/guide.md's export), so the same output.
  outputs = [h[0].tokens for h in restored.search(sources, beam_size=4, alpha=0.0,
                                                  max_new_tokens=32, batch_size=len(lines))]
  batch = tokenizer(lines, return_tensors='pt', padding=True, truncation=True)
  assert batch['input_ids'][-1].tolist() == sources[-1]  # max_len - 1 pieces, then EOS
  generated = model.generate(**batch, num_beams=4, length_penalty=0.0, max_new_tokens=32,
                             output_scores=True, return_dict_in_generate=True)
  theirs = [_until_eos(row[1:]) for row in generated.sequences.tolist()]

  def reference(i):  # the rule in NumPy, on our model
    search = beam_reference.model_next_log_probs(restored.module, sources[i], 32, 4)
    return beam_reference.beam_search(search, k=4, max_new_tokens=32)
  # The same translations, but where float rounding decides a near tie (< 1e-3 nats).
  assert beam_reference.differences_are_ties(outputs, theirs, reference) <= 1
  same = [i for i in range(len(lines)) if theirs[i] == outputs[i]]
  assert sum(o[-1] == 1 for o in outputs) >= 4  # most of them end with EOS before max_len
  texts = tokenizer.batch_decode(generated.sequences, skip_special_tokens=True)
  assert [texts[i] for i in same] == [restored.tokenizer.decode(outputs[i]) for i in same]
  # Their beam scores (length_penalty=0: the sum of log-probabilities, EOS included) against
  # our model's log-probability of the same translations.
  hyps = np.zeros((len(outputs), max(map(len, outputs))), np.int32)
  for row, ids in enumerate(outputs):
    hyps[row, :len(ids)] = ids
  logits = restored.module(inputs, hyps).at[..., 0].set(-np.inf)
  log_probs = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), hyps[..., None], -1)
  ours = np.where(hyps > 0, log_probs[..., 0], 0.0).sum(axis=1)
  np.testing.assert_allclose(generated.sequences_scores.numpy()[same], ours[same], atol=1e-3,
                             rtol=0)
  # The README's lines on this export: test_trained_export_generates_a_long_line_with_padding_
  # alone runs them (on a line past max_len).


def _run_readme_lines(out, line):
  """The README's three lines, as printed, on the export `out` and `line`: one translation."""
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    readme = f.read()
  blocks = re.findall(r'^( *)```python\n(.*?)^\1```', readme, re.DOTALL | re.MULTILINE)
  code = [textwrap.dedent(c) for _, c in blocks if 'AutoModelForSeq2SeqLM' in c][0]
  assert len(code.strip().splitlines()) == 3
  printed = []
  exec(code.replace('runs/default_hf', out).replace("'A man is riding a bike.'", repr(line)),  # noqa: S102
       {'print': printed.append})
  assert len(printed) == 1 and len(printed[0]) == 1 and isinstance(printed[0][0], str)
  return printed[0][0]


def test_cli_refuses_without_writing(trained, tmp_path):
  import json
  import shutil

  bad = tmp_path / 'learned_positions'
  shutil.copytree(os.path.join(trained, 'tokenizer'), bad / 'tokenizer')
  with open(os.path.join(trained, 'config.json')) as f:
    config = json.load(f)
  config['model']['positional_encoding'] = 'learned'
  (bad / 'config.json').write_text(json.dumps(config))
  out = tmp_path / 'out'
  proc = _export(f'--workdir={bad}', f'--output_dir={out}')
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('export.py: error: ')
  assert 'positional_encoding=learned' in lines[0]
  assert sorted(os.listdir(tmp_path)) == ['learned_positions']  # nothing written, no temp dir
  # A non-empty output directory is refused too (in-process: same check, no restore).
  (out / 'keep').mkdir(parents=True)
  with pytest.raises(writer.ExportError, match='not empty'):
    writer.export_workdir(trained, str(out))
  assert os.listdir(out) == ['keep']


# ----------------------------------------------------------------------------- long lines

def _long_line(words=180):
  """test2016 lines joined until they make a ~`words`-word line, far past max_len pieces."""
  line = ''
  for sentence in _sentences(60):
    if len(line.split()) >= words:
      break
    line = f'{line} {sentence}'.strip()
  return line


def test_trained_export_generates_a_long_line_with_padding_alone(trained, exported):
  """The README's lines (`padding=True`, no `truncation=True`) on a ~180-word line: the exported
  Marian defines positions past max_len, so generate() translates the whole line instead of
  failing, as our model would with its sinusoid table extended (`max_len=1024`: the same
  parameters); the tokenizer still cuts at max_len when asked to (`truncation=True`, as
  decode.py). (Once, on this line: a short one runs the same three lines, whose translations
  of short lines test_trained_export_translates_as_decode_py checks through the same calls.)"""
  import inference

  out, _ = exported
  config = transformers.AutoConfig.from_pretrained(out)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  max_len = tokenizer.model_max_length
  line = _long_line()
  ids = tokenizer(line)['input_ids']
  assert len(line.split()) >= 180 and len(ids) > 3 * max_len
  assert config.max_position_embeddings >= 1024 > len(ids)
  assert len(tokenizer(line, truncation=True)['input_ids']) == max_len
  printed = _run_readme_lines(out, line)
  # The whole line, as our model extended past max_len reads it: beam 4 with no length
  # penalty is the same search in both (the guide's export), so the same translation (or a
  # near tie).
  restored = inference.load(trained, average_last=2, warn=lambda message: None)
  extended = with_options(restored.module, max_len=1024)
  assert ids == restored.tokenizer.encode(line)  # the same pieces, and EOS
  model = _load(out, transformers.AutoModelForSeq2SeqLM)
  generated = model.generate(**tokenizer([line], padding=True, return_tensors='pt'), num_beams=4,
                             length_penalty=0.0, max_new_tokens=32)
  theirs = [_until_eos(generated[0, 1:].tolist())]
  tokens, _ = BeamSearch(beam_size=4, alpha=0.0).search(
      extended, np.asarray([ids], np.int32), limits=Limits(max_new_tokens=32, batch_size=1))
  ours = [_until_eos([int(t) for t in tokens[0, 0] if t])]

  def reference(_):  # the rule in NumPy, on our extended model
    search = beam_reference.model_next_log_probs(extended, ids, 32, 4)
    return beam_reference.beam_search(search, k=4, max_new_tokens=32)
  assert beam_reference.differences_are_ties(ours, theirs, reference) <= 1
  assert len(ours[0]) > 8 and printed.strip()  # a translation, not an empty or cut-off line
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    readme = f.read()
  assert 'padding=True, return_tensors' in readme and 'truncation=True, return' not in readme


@pytest.mark.parametrize('norm', ['post', 'pre'])
def test_long_input_runs_and_short_logits_are_unchanged(tmp_path, norm):
  """Marian / Pegasus on a padded batch whose first line is past max_len: generate() runs, and
  the short line's logits are still ours (the table's first max_len rows are the same)."""
  config = default.get_config('tiny').model
  config.norm_position = norm
  module, params = export_workdirs.random_model(config)
  arch, _ = writer.write_export(str(tmp_path), params, module.config, CharTokenizer(CHARS), DECODE)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
  batch = tokenizer(['a man is riding a bike. ' * 12, 'ROSE: his tale'], padding=True,
                    return_tensors='pt')
  assert batch['input_ids'].shape[1] > 4 * config.max_len
  model = _load(tmp_path, getattr(transformers, arch), eps=LAYER_NORM_EPS)
  assert model.generate(**batch, num_beams=4).shape[0] == 2
  inputs = batch['input_ids'].numpy()
  short = inputs[1:, :(inputs[1] > 0).sum()]
  targets = _padded_batch(np.random.default_rng(0), config.vocab_size, 2, 11, [11, 6])
  ours = np.asarray(module(short, targets[1:]))[..., 1:]
  theirs = _hf_seq2seq_logits(model, inputs, targets)[1:]
  valid = targets[1:] > 0
  np.testing.assert_allclose(theirs[valid], ours[valid], atol=1e-5, rtol=0)


def test_learned_positions_language_model_stops_at_max_len(tmp_path):
  """A learned table has max_len rows: a prompt past it fails with transformers' message naming
  `max_length` (= max_len, the guide's export), not inside the model."""
  config = shakespeare_char.get_config('tiny').model
  config.vocab_size, config.positional_encoding = len(CHARS) + 1, 'learned'
  module, params = export_workdirs.random_model(config)
  writer.write_export(str(tmp_path), params, module.config, CharTokenizer(CHARS), DECODE)
  model = _load(tmp_path, transformers.GPT2LMHeadModel)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
  assert model.config.n_positions == module.config.max_len
  with pytest.raises(ValueError, match=f'`max_length` is set to {module.config.max_len}'):
    model.generate(**tokenizer(['a man is riding a bike. ' * 3], return_tensors='pt'),
                   do_sample=False)
