"""transformers checkpoints in (import.py, hf_import). Small random Marian, GPT-2
and BERT checkpoints built here with transformers' own classes (tests/hf_checkpoints.py):
logits equal to transformers', tokenizer ids equal on a few hundred real sentences, greedy and
beam outputs equal to generate(), and our exports imported back to identical parameters (an
imported BERT exported as the BertModel it was, computing our encoder's output)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers

import inference
from autoregressive.strategies.beam import beam_search_decode
from autoregressive.strategies.greedy import greedy_decode
from hf_import import import_checkpoint, importer
from hf_import.architectures import Unsupported
from hf_import.checkpoint_dir import ImportProblem
from tests import REPO, beam_reference, hf_checkpoints as ckpts, mains
from tests.training import test_train_synthetic as syn

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  """{name: (checkpoint dir, imported workdir)} for marian, gpt2 and bert."""
  root = tmp_path_factory.mktemp('hf_import')
  out = {}
  for name, build in (('marian', ckpts.marian), ('gpt2', ckpts.gpt2), ('bert', ckpts.bert)):
    source, workdir = str(root / name), str(root / f'{name}_workdir')
    build(source)
    import_checkpoint(source, workdir)
    out[name] = (source, workdir)
  return out


def _padded(rows: list[list[int]]) -> np.ndarray:
  out = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _until(ids, stop) -> list[int]:
  ids = list(ids)
  return ids[:ids.index(stop)] if stop in ids else ids


def test_marian_equals_transformers(built):
  """Tokenizer ids (source and target side) and decoded text, logits to 1e-5, greedy and beam
  outputs (length_penalty 0) of an OPUS-MT-style model: swish, a final_logits_bias, pad last."""
  source, workdir = built['marian']
  session = inference.load(workdir)
  ours, theirs = session.tokenizer, transformers.MarianTokenizer.from_pretrained(source)
  src, tgt = (ckpts.multi30k('test_2016_flickr', lang, 300) for lang in ('en', 'de'))
  eos = theirs.eos_token_id
  for s, t in zip(src, tgt, strict=True):
    assert ours.to_theirs(ours.encode(s)) + [eos] == theirs(s).input_ids
    ids = ours.encode(t, target=True)
    assert ours.to_theirs(ids) + [eos] == theirs(text_target=t).input_ids
    assert ours.decode(ids) == theirs.decode(ours.to_theirs(ids), skip_special_tokens=True)
  # The token cache segments each side with its own model (as does scoring): it encodes a
  # pair's second feature with target=True.
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  assert tokenizers.encode_all(ours, tgt[:20], target=True) == [ours.encode(t, target=True)
                                                                for t in tgt[:20]]
  assert tokenizers.encode_all(ours, src[:20]) == [ours.encode(s) for s in src[:20]]
  other = type(ours)(ours.files['source.spm'], ours.files['source.spm'], ours.vocab,
                     ours.order, ours.specials)  # the source model on both sides
  assert tokenizers.fingerprint(ours) != tokenizers.fingerprint(other)  # other cached ids
  model = transformers.MarianMTModel.from_pretrained(source).eval()
  assert session.module.config.final_logits_bias and session.module.config.activation == 'silu'
  inputs = _padded([ours.encode(s) for s in src[:6]])
  targets = _padded([ours.encode(t, target=True) for t in tgt[:6]])
  with torch.no_grad():
    hf = model(input_ids=torch.tensor(ours.order[inputs]), attention_mask=torch.tensor(inputs > 0),
               decoder_input_ids=torch.tensor(ours.order[np.pad(targets, ((0, 0), (1, 0)))[:, :-1]])
               ).logits.numpy()[..., ours.order]
  # Pad (our 0, Marian's last id) is never generated: its logit is not carried.
  np.testing.assert_allclose(np.asarray(session.module(inputs, targets))[targets > 0][:, 1:],
                             hf[targets > 0][:, 1:], atol=1e-5, rtol=0)


def test_a_trained_model_in_opus_layout_searches_as_generate(tmp_path_factory):
  """The trained Multi30k model (tests/export_workdirs.py), exported and renumbered as OPUS-MT
  numbers tokens (EOS 0, pad last), imported: beam search (length_penalty 0) gives generate()'s
  translations. (Beam 4 only: the numbering enters greedy decoding the same way, through the
  tokenizer's EOS and pad; an imported model's greedy output against generate()'s is
  test_gpt2_equals_transformers', our Marian's greedy against CTranslate2's test_export_ct2's
  trained test.)"""
  from tests import export_workdirs  # pylint: disable=import-outside-toplevel

  root = tmp_path_factory.mktemp('opus')
  exported, _ = export_workdirs.exported_hf(tmp_path_factory)  # shared: copied by opus_layout
  source = ckpts.opus_layout(exported, str(root / 'opus'))
  import_checkpoint(source, str(root / 'workdir'))
  session = inference.load(str(root / 'workdir'))
  assert session.tokenizer.order[:3].tolist() == [session.module.config.vocab_size - 1, 0, 1]
  model = transformers.MarianMTModel.from_pretrained(source).eval()
  theirs = transformers.MarianTokenizer.from_pretrained(source)
  src = ckpts.multi30k('test_2016_flickr', 'en', 8)
  batch = theirs(src, return_tensors='pt', padding=True)
  beam = 4
  found = [h[0].tokens for h in session.search(session.encode(src), beam_size=beam,
                                               max_new_tokens=32, batch_size=8, alpha=0.0)]
  generated = model.generate(**batch, num_beams=beam, length_penalty=0.0, max_new_tokens=32,
                             early_stopping='never', min_new_tokens=1, do_sample=False,
                             forced_eos_token_id=None)
  # The same tokens, but where a float near-tie decides (measured by the NumPy reference
  # search): another CPU's arithmetic may break it the other way (issue 62).
  mine = [list(ids) for ids in found]
  generated_ids = [session.tokenizer.to_ours(_until(row[1:], 0)) for row in generated.tolist()]
  sources = session.encode(src)

  def reference(i, beam=beam, sources=sources):
    search = beam_reference.model_next_log_probs(session.module, sources[i], 32, beam)
    return beam_reference.beam_search(search, k=beam, max_new_tokens=32)
  ties = beam_reference.differences_are_ties(mine, generated_ids, reference)
  assert ties <= 1
  assert sum(ids[-1] == session.tokenizer.eos_id for ids in found) >= 4  # most end
  texts = theirs.batch_decode(generated, skip_special_tokens=True)
  same = [i for i in range(len(src)) if session.tokenizer.to_theirs(mine[i]) ==
          session.tokenizer.to_theirs(generated_ids[i])]
  assert [texts[i] for i in same] == [session.tokenizer.decode(mine[i]) for i in same]


def test_gpt2_equals_transformers(built):
  """Byte-level BPE ids and text on Tiny Shakespeare, logits to 1e-5, greedy and beam
  continuations; <|endoftext|> is our start token (pad 0), so generation runs to the limit."""
  source, workdir = built['gpt2']
  session = inference.load(workdir)
  ours, theirs = session.tokenizer, transformers.AutoTokenizer.from_pretrained(source)
  lines = [line for line in ckpts.shakespeare().splitlines()[:400] if line][:300]
  for line in lines:
    assert ours.to_theirs(ours.encode(line)) == theirs(line).input_ids
    assert ours.decode(ours.encode(line)) == line
  model = transformers.GPT2LMHeadModel.from_pretrained(source).eval()
  start = theirs.bos_token_id
  tokens = _padded([ours.encode(line) for line in lines[:6]])
  with torch.no_grad():  # GPT-2 reads our decoder input: the start token, then the text
    hf = model(input_ids=torch.tensor(ours.order[np.pad(tokens, ((0, 0), (1, 0)))[:, :-1]]),
               attention_mask=torch.tensor(tokens > 0)).logits.numpy()[..., ours.order]
  np.testing.assert_allclose(np.asarray(session.module(tokens))[tokens > 0], hf[tokens > 0],
                             atol=1e-5, rtol=0)
  prompt = np.array([ours.encode('ROMEO: But soft, what light')], np.int32)
  hf_prompt = torch.tensor([[start] + ours.to_theirs(prompt[0])])
  greedy = greedy_decode(session.module, prompt=prompt, max_new_tokens=10, eos_id=None)
  beams, _ = beam_search_decode(session.module, prompt=prompt, beam_size=4, alpha=0.0,
                                max_new_tokens=10, eos_id=None)
  for beam, found in ((1, np.asarray(greedy)[0]), (4, np.asarray(beams)[0, 0])):
    generated = model.generate(hf_prompt, num_beams=beam, length_penalty=0.0, do_sample=False,
                               max_new_tokens=10, suppress_tokens=[start], pad_token_id=start,
                               early_stopping='never')
    assert generated[0, hf_prompt.shape[1]:].tolist() == ours.to_theirs(found)


def test_bert_equals_transformers(built):
  """WordPiece ids ([CLS] ... [SEP]) and the contextual embeddings to 1e-5."""
  source, workdir = built['bert']
  session = inference.Restored(workdir)  # an encoder: no decoding Session
  ours, theirs = session.tokenizer, transformers.AutoTokenizer.from_pretrained(source)
  src = ckpts.multi30k('test_2016_flickr', 'en', 300)
  for line in src:
    assert ours.to_theirs(ours.encode(line)) == theirs(line).input_ids
  model = transformers.BertModel.from_pretrained(source).eval()
  tokens = _padded([ours.encode(line) for line in src[:6]])
  with torch.no_grad():
    hf = model(input_ids=torch.tensor(ours.order[tokens]),
               attention_mask=torch.tensor(tokens > 0)).last_hidden_state.numpy()
  np.testing.assert_allclose(np.asarray(session.module(tokens))[tokens > 0], hf[tokens > 0],
                             atol=1e-5, rtol=0)


def _params_equal(a, b) -> bool:
  pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
  return (jax.tree.structure(a) == jax.tree.structure(b)
          and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in pairs))


def _bert_export_computes_ours(workdir: str, exported: str) -> None:
  """The exported BertModel loads every weight from the file (the zero pooler too), has no
  generation config, and its last_hidden_state is our encoder's output (non-pad, 1e-5)."""
  model, info = transformers.BertModel.from_pretrained(exported, output_loading_info=True)
  assert not any(info.values()), info
  assert not os.path.exists(os.path.join(exported, 'generation_config.json'))
  restored = inference.Restored(workdir)
  tokens = _padded([restored.tokenizer.encode(line)
                    for line in ckpts.multi30k('test_2016_flickr', 'en', 6)])
  with torch.no_grad():  # the export's ids are ours: no reordering
    hf = model.eval()(input_ids=torch.tensor(tokens),
                      attention_mask=torch.tensor(tokens > 0)).last_hidden_state.numpy()
  np.testing.assert_allclose(np.asarray(restored.module(tokens))[tokens > 0], hf[tokens > 0],
                             atol=1e-5, rtol=0)


@pytest.mark.parametrize('name', ['marian', 'gpt2', 'bert'])
def test_an_import_exports_and_imports_back_to_the_same_parameters(built, name, tmp_path):
  """import -> export.py -> import: the same parameters and token ids (the export writes the
  imported tokenizer's own files, renumbered as ours), and transformers' tokenizer of the
  export gives our ids; the exported BertModel computes our encoder's output. (Our own
  models' export -> import: the guide's test below, for a translation model. A language model
  exports as GPT-2, whose import is checked against transformers above; one trained with
  `scale_embeddings` comes back with the scale folded into `wte` and the final LayerNorm,
  hf_export.convert: the same logits.)"""
  from hf_export import export_workdir  # pylint: disable=import-outside-toplevel
  from input_pipeline.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  workdir = built[name][1]
  exported, again = str(tmp_path / 'hf'), str(tmp_path / 'again')
  export_workdir(workdir, exported)
  import_checkpoint(exported, again)
  assert _params_equal(checkpoint.restore_params(workdir)[0],
                       checkpoint.restore_params(again)[0])
  # generation_config.json's settings come back (they were dropped: beam 2 came back as 4).
  decode = [_config(w)['decode'] for w in (workdir, again)]
  assert decode[1] == decode[0]
  first, second = load_tokenizer(workdir), load_tokenizer(again)
  theirs = transformers.AutoTokenizer.from_pretrained(exported)
  for line in ckpts.multi30k('test_2016_flickr', 'en', 20):
    assert second.encode(line) == first.encode(line)
    assert theirs(line).input_ids == first.encode(line)
  if name == 'bert':
    _bert_export_computes_ours(workdir, exported)


def _config(workdir: str) -> dict:
  import json  # pylint: disable=import-outside-toplevel
  with open(os.path.join(workdir, 'config.json')) as f:
    return json.load(f)


def _copy(source: str, target: str, drop=(), **config) -> str:
  import json  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.copytree(source, target, ignore=shutil.ignore_patterns(*drop))
  if config:
    path = os.path.join(target, 'config.json')
    with open(path) as f:
      fields = json.load(f)
    with open(path, 'w') as f:
      json.dump({**fields, **config}, f)
  return target


def test_bad_checkpoints_are_one_line_and_write_nothing(built, tmp_path):
  """Not a checkpoint, an unsupported architecture or field, a missing tokenizer file, weights
  that do not fit their config, an existing workdir: one line each, nothing written."""
  marian = built['marian'][0]
  cases = [
      (str(tmp_path), 'is not a transformers checkpoint: config.json not found'),
      (_copy(marian, str(tmp_path / 'arch'), architectures=['T5ForConditionalGeneration']),
       "architectures=['T5ForConditionalGeneration'] cannot be imported"),
      (_copy(marian, str(tmp_path / 'act'), activation_function='quick_gelu'),
       "activation_function='quick_gelu' cannot be imported"),
      (_copy(marian, str(tmp_path / 'heads'), decoder_attention_heads=2),
       'decoder_attention_heads=2 cannot be imported'),
      (_copy(marian, str(tmp_path / 'spm'), drop=('target.spm',)), 'has no target.spm'),
      (_copy(marian, str(tmp_path / 'shape'), d_model=48),
       'model.decoder.layers.0.encoder_attn.k_proj.bias has shape (32,) in the checkpoint but '
       'config.json makes it (48,)'),
      # Issue 58, cause 4: weights that do not fit config.json were dropped or sliced, exit 0.
      (_copy(built['gpt2'][0], str(tmp_path / 'layers'), n_layer=1),
       'the checkpoint has transformer.h.1.attn.c_attn.bias (96,), which the model of its '
       'config.json does not'),
      (_copy(built['gpt2'][0], str(tmp_path / 'positions'), n_positions=16),
       'wpe.weight has shape (64, 32) in the checkpoint but config.json makes it (16, 32)'),
      (_copy(built['bert'][0], str(tmp_path / 'rows'), vocab_size=290),
       'has shape (300, 32) in the checkpoint but config.json makes it (290, 32)'),
      (_copy(marian, str(tmp_path / 'dropout'), dropout='abc'), 'describes no MarianMTModel'),
  ]
  for source, message in cases:
    workdir = str(tmp_path / 'new')
    with pytest.raises((ImportProblem, Unsupported), match='.') as caught:
      import_checkpoint(source, workdir)
    assert message in str(caught.value) and '\n' not in str(caught.value)
    assert not os.path.exists(workdir)
    assert not [n for n in os.listdir(tmp_path) if importer.STAGING in n]  # no staging left
  existing = built['marian'][1]
  before = sorted(os.listdir(existing))
  proc = subprocess.run([sys.executable, 'import.py', f'--from={marian}',
                         f'--workdir={existing}'], cwd=REPO, env=syn.subprocess_env(1),
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 2 and proc.stderr.strip() == (
      f'import.py: error: --workdir={existing} exists; give a new directory (nothing was '
      'written)')
  assert sorted(os.listdir(existing)) == before
  assert importer.load(marian).architecture == 'MarianMTModel'


def _guide_lines() -> list[str]:
  """The command lines of docs/guide.md's offline block under 'Start from a pretrained model'."""
  import re  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO, 'docs', 'guide.md'), encoding='utf-8') as f:
    text = f.read()
  section = text[text.index('## Start from a pretrained model'):]
  block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
  return [line for line in block.splitlines() if line.strip()]


TINY_RUN = ('--config.train.batch_size=16', '--config.train.checkpoint_every_steps=2',
            '--config.train.eval_every_steps=4', '--config.train.num_eval_batches=1',
            '--config.decode.num_eval_sentences=0')


def test_the_guides_offline_lines_run(workdirs, tmp_path):
  """The guide's offline block as printed, run where `runs/default` is the suite's tiny
  translation workdir: export, import (the same parameters and token ids as runs/default),
  decode, fine-tune from the import, decode. Made cheap: decoding reads 16 lines of test2016,
  the fine-tuning takes 4 steps of 16 rows. (That a fine-tune resumes from its own checkpoint,
  not from the import: test_train_cli's
  test_a_fine_tune_resumes_without_its_init_from_directory.)"""
  import shlex  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.copytree(workdirs['mt'], tmp_path / 'runs' / 'default')
  small = {}
  for lang in ('en', 'de'):
    small[f'data/multi30k/test_2016_flickr.{lang}.gz'] = str(tmp_path / f'test.{lang}')
    (tmp_path / f'test.{lang}').write_text(
        '\n'.join(ckpts.multi30k('test_2016_flickr', lang, 16)) + '\n')
  lines = _guide_lines()
  assert [shlex.split(line)[1] for line in lines] == [
      'export.py', 'import.py', 'decode.py', 'train.py', 'decode.py']

  def args_of(line: str) -> list[str]:
    args = shlex.split(line)[2:]
    for old, new in {**small, 'runs/': f'{tmp_path}/runs/'}.items():
      args = [arg.replace(old, new) for arg in args]
    return args
  # The lines in their order, in one interpreter.
  runs = {'export': lines[0], 'import': lines[1], 'decode imported': lines[2],
          'train': lines[3], 'decode fine-tuned': lines[4]}
  extra = {'train': (*TINY_RUN, '--config.train.num_steps=4')}

  def command(name: str, line: str) -> tuple[str, list[str]]:
    args = args_of(line)
    if name in extra:
      args = [a for a in args if not a.startswith('--config.train.num_steps')] + list(extra[name])
    return shlex.split(line)[1], args
  results = mains.run_mains([command(*run) for run in runs.items()], cwd=str(tmp_path))
  for (name, line), (code, _, err) in zip(runs.items(), results, strict=True):
    assert code == 0, f'{name}: {line}\n{err[-3000:]}'
  outputs = {name: out for name, (_, out, _) in zip(runs, results, strict=True)}
  imported, finetuned = outputs['decode imported'], outputs['decode fine-tuned']
  assert 'BLEU' in results[2][2] and 'BLEU' in results[4][2]
  assert len(imported.splitlines()) == len(finetuned.splitlines()) == 16
  assert 'imported MarianMTModel' in outputs['import']
  from input_pipeline.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  runs = tmp_path / 'runs'
  assert _params_equal(checkpoint.restore_params(str(runs / 'default'))[0],
                       checkpoint.restore_params(str(runs / 'imported'))[0])
  text = 'A man in an orange hat.'
  assert (load_tokenizer(str(runs / 'imported')).encode(text) ==
          load_tokenizer(str(runs / 'default')).encode(text))
  # The guide: decoding the import gives the original's translations, the one change being
  # Marian's LayerNorm epsilon: the original model under that epsilon translates alike.
  import inference  # pylint: disable=import-outside-toplevel
  from autoregressive.session import Session  # pylint: disable=import-outside-toplevel
  from model.build import with_options  # pylint: disable=import-outside-toplevel
  original = inference.load(str(runs / 'default'))
  epsilon = inference.load(str(runs / 'imported')).module.config.layer_norm_epsilon
  assert epsilon != original.module.config.layer_norm_epsilon
  same = Session(with_options(original.module, layer_norm_epsilon=epsilon), original.tokenizer,
                 original.config)
  sources = (tmp_path / 'test.en').read_text().splitlines()
  assert imported.splitlines() == same.translate(sources)
  assert f'starting from the parameters of {runs}/imported (its step 0)' in outputs['train']


def test_staging_touches_nothing_of_the_users_and_a_racing_import_is_refused(built, tmp_path,
                                                                            monkeypatch):
  """Issue 58, cause 1: the staging directory is private (a user's NEW.importing, a file or a
  symlink at that name, are left as they were), and an import that finds NEW written by
  another while it staged is refused in one line, the other's workdir untouched."""
  marian = built['marian'][0]
  theirs = tmp_path / 'new.importing'
  theirs.mkdir()
  (theirs / 'thesis.tex').write_text('hi')
  (tmp_path / 'other.importing').write_text('a file')
  os.symlink(str(theirs / 'thesis.tex'), tmp_path / 'third.importing')
  imported = importer.load(marian)
  for name in ('new', 'other', 'third'):
    importer.write_workdir(imported, str(tmp_path / name))
    assert os.path.isfile(tmp_path / name / 'config.json')
  assert (theirs / 'thesis.tex').read_text() == 'hi'
  assert (tmp_path / 'other.importing').read_text() == 'a file'
  assert os.path.islink(tmp_path / 'third.importing')
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  save = checkpoint.Checkpointer.save
  racing = tmp_path / 'raced'

  raced = []

  def other_import_finishes_meanwhile(self, *args, **kwargs):
    if not raced:
      raced.append(True)
      importer.write_workdir(imported, str(racing))
    return save(self, *args, **kwargs)

  monkeypatch.setattr(checkpoint.Checkpointer, 'save', other_import_finishes_meanwhile)
  with pytest.raises(ImportProblem) as caught:
    importer.write_workdir(imported, str(racing))
  assert str(caught.value) == (f'--workdir={racing} exists; give a new directory (nothing was '
                               'written)')
  assert sorted(os.listdir(tmp_path)) == ['new', 'new.importing', 'other', 'other.importing',
                                          'raced', 'third', 'third.importing']
  assert inference.load(str(racing)).module is not None  # the other's import restores


@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_non_finite_weights_are_refused(built, tmp_path, value):
  """Issue 58, cause 6: a NaN weight imported gave empty translations with exit 0, an inf
  '!!!!!!!!'. Refused in one line naming the weight; nothing written."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  source = _copy(built['marian'][0], str(tmp_path / 'bad'))
  path = os.path.join(source, 'model.safetensors')
  tensors = load_file(path)
  name = next(k for k in sorted(tensors) if k.endswith('fc1.weight'))
  tensors[name] = tensors[name].copy()
  tensors[name].flat[3] = value
  save_file(tensors, path, metadata={'format': 'pt'})
  workdir = str(tmp_path / 'new')
  with pytest.raises(ImportProblem) as caught:
    import_checkpoint(source, workdir)
  message = str(caught.value)
  assert 'has 1 non-finite value(s) (NaN or inf); nothing was written' in message, message
  assert '/ffn/wi/kernel' in message and '\n' not in message
  assert not os.path.exists(workdir)


def test_init_from_refusals_leave_the_workdir_as_they_found_it(built, workdirs, tmp_path):
  """Issue 58, cause 3: a refused fine-tune left the imported tokenizer's files behind (the
  next train.py then failed on them); a workdir with another tokenizer was trained with it; a
  source without checkpoints was refused only after config.json and its tokenizer were
  written."""
  import shutil  # pylint: disable=import-outside-toplevel
  marian = built['marian'][1]
  empty = str(tmp_path / 'no_checkpoints')
  os.makedirs(empty)
  shutil.copy(os.path.join(marian, 'config.json'), empty)
  other = str(tmp_path / 'other_tokenizer')
  os.makedirs(other)
  shutil.copytree(os.path.join(workdirs['mt'], 'tokenizer'), os.path.join(other, 'tokenizer'))
  before = sorted(os.listdir(os.path.join(other, 'tokenizer')))
  refused, fresh = str(tmp_path / 'refused'), str(tmp_path / 'fresh')
  base = ['--config.train.num_steps=1', '--config.decode.num_eval_sentences=0']
  runs = [[f'--workdir={refused}', f'--config.train.init_from={marian}',
           '--config.data.dataset=parallel_text',
           f'--config.data.train_files={tmp_path}/missing.en,{tmp_path}/missing.de', *base],
          [f'--workdir={fresh}', f'--config.train.init_from={empty}', *base],
          [f'--workdir={other}', f'--config.train.init_from={marian}', *base],
          # The tokenizer's size was silently replaced by the source's.
          [f'--workdir={fresh}', f'--config.train.init_from={marian}',
           '--config.data.vocab_size=999', *base]]
  results = mains.run_mains(runs, 'train.py', devices=1)
  (code, _, err), (code2, _, err2), (code3, _, err3), (code4, _, err4) = results
  assert code4 == 2 and ('--config.data.vocab_size=999 cannot be set with config.train.'
                         f'init_from: the tokenizer of {marian} fixes it') in err4, err4
  assert code == 2 and 'missing.en' in err, err
  assert not os.path.exists(refused) or os.listdir(refused) == [], os.listdir(refused)
  assert code2 == 2 and 'has no checkpoint to start from' in err2 and not os.path.exists(fresh)
  assert code3 == 2 and 'holds another tokenizer than config.train.init_from' in err3, err3
  assert sorted(os.listdir(other)) == ['tokenizer']
  assert sorted(os.listdir(os.path.join(other, 'tokenizer'))) == before


def test_import_reads_only_regular_files_inside_the_checkpoint(built, tmp_path):
  """Issue 58, cause 10: a FIFO at a tokenizer file hung the import forever, a symlink to
  /dev/zero read until memory ran out, an absolute shard path in the index read a file outside
  the checkpoint. Each is one line now."""
  import json  # pylint: disable=import-outside-toplevel

  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  marian = built['marian'][0]
  fifo = _copy(marian, str(tmp_path / 'fifo'), drop=('source.spm',))
  os.mkfifo(os.path.join(fifo, 'source.spm'))
  zero = _copy(marian, str(tmp_path / 'zero'), drop=('vocab.json',))
  os.symlink('/dev/zero', os.path.join(zero, 'vocab.json'))
  outside = _copy(marian, str(tmp_path / 'outside'), drop=('model.safetensors',))
  tensors = load_file(os.path.join(marian, 'model.safetensors'))
  shard = str(tmp_path / 'elsewhere.safetensors')
  save_file(tensors, shard, metadata={'format': 'pt'})
  with open(os.path.join(outside, 'model.safetensors.index.json'), 'w') as f:
    json.dump({'weight_map': {name: shard for name in tensors}}, f)
  for source, message in ((fifo, 'source.spm is a FIFO, not a regular file'),
                          (zero, 'vocab.json is a device, not a regular file'),
                          (outside, f'{shard!r} is outside the checkpoint directory')):
    with pytest.raises(ImportProblem) as caught:
      import_checkpoint(source, str(tmp_path / 'new'))
    assert message in str(caught.value) and '\n' not in str(caught.value)
    assert not os.path.exists(tmp_path / 'new')


def _edit_json(directory: str, name: str, change) -> str:
  import json  # pylint: disable=import-outside-toplevel
  path = os.path.join(directory, name)
  with open(path) as f:
    data = json.load(f)
  change(data)
  with open(path, 'w') as f:
    json.dump(data, f)
  return directory


def test_tokenizer_and_config_values_are_checked_against_the_model(built, tmp_path):
  """Issue 58, causes 5 and 9: a tokenizer with ids the model lacks, another model's
  tokenizer, a special token id outside the vocabulary or null, a value of the wrong type, a
  sentencepiece file that is not one, bad generation settings: one line each before anything
  is written (they were tracebacks, or an import that failed only when decoding)."""
  marian, gpt2, bert = (built[n][0] for n in ('marian', 'gpt2', 'bert'))
  vocab = _config(built['marian'][1])['model']['vocab_size']

  def copy(source, name, **config):
    return _copy(source, str(tmp_path / name), **config)

  garbage = copy(marian, 'garbage_spm')
  with open(os.path.join(garbage, 'source.spm'), 'wb') as f:
    f.write(b'not a model' * 10)
  other = copy(gpt2, 'bert_tokenizer')
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.copy(os.path.join(bert, 'tokenizer.json'), os.path.join(other, 'tokenizer.json'))
  cases = [
      (_edit_json(copy(marian, 'big_id'), 'vocab.json', lambda v: v.update(zzz=vocab + 9)),
       f"vocab.json gives 'zzz' the id {vocab + 9}, but the model has ids 0 to {vocab - 1}"),
      (_edit_json(copy(marian, 'word_id'), 'vocab.json', lambda v: v.update(zzz='one')),
       "vocab.json gives 'zzz' the id 'one'"),
      (garbage, 'source.spm or target.spm is not a sentencepiece model'),
      (other, 'tokenizer.json is a WordPiece tokenizer, but GPT2LMHeadModel comes with a BPE'),
      (copy(marian, 'pad_big', pad_token_id=9999), 'config.json pad_token_id=9999 cannot be '
       f'imported: token ids are integers from 0 to vocab_size - 1 = {vocab - 1}'),
      (copy(marian, 'pad_null', pad_token_id=None), 'pad_token_id=None cannot be imported: '
       'MarianMTModel needs it'),
      (_edit_json(copy(gpt2, 'no_bos'), 'config.json', lambda c: c.pop('bos_token_id')),
       'bos_token_id=None cannot be imported: GPT2LMHeadModel needs it'),
      (copy(marian, 'arch_int', architectures=5), 'architectures=5 cannot be imported'),
      (copy(marian, 'arch_nested', architectures=[['MarianMTModel']]),
       "architectures=[['MarianMTModel']] cannot be imported"),
      (copy(marian, 'act_list', activation_function=['relu']),
       "field 'activation_function': TypeError: Field 'activation_function' expected str"),
      (_edit_json(copy(marian, 'beams'), 'generation_config.json',
                  lambda g: g.update(num_beams=0)), 'generation_config.json: config.decode'),
  ]
  for source, message in cases:
    workdir = str(tmp_path / 'new')
    with pytest.raises((ImportProblem, Unsupported), match='.') as caught:
      import_checkpoint(source, workdir)
    assert message in str(caught.value) and '\n' not in str(caught.value), source
    assert not os.path.exists(workdir)
    assert not [n for n in os.listdir(tmp_path) if importer.STAGING in n]
  (tmp_path / 'a_file').write_text('mine')  # a target under a regular file
  with pytest.raises(ImportProblem, match=f'cannot write there: {tmp_path}/a_file is a file, '
                     'not a directory'):
    import_checkpoint(marian, str(tmp_path / 'a_file' / 'new'))
  assert (tmp_path / 'a_file').read_text() == 'mine'


def test_generation_settings_are_carried_into_config_decode(built, tmp_path):
  """A checkpoint's beam size and new-token bound become config.decode's (an import used to
  drop them: beam 2 / 32 tokens decoded as beam 4 / 128)."""
  source = _edit_json(_copy(built['marian'][0], str(tmp_path / 'gen')), 'generation_config.json',
                      lambda g: g.update(num_beams=2, max_new_tokens=32, length_penalty=0.0))
  decode = importer.load(source).decode
  assert (decode['beam_size'], decode['max_new_tokens'], decode['alpha']) == (2, 32, 0.0)


def test_ctrl_c_while_the_checkpoint_is_written_leaves_nothing(built, tmp_path, monkeypatch):
  """Also seen in issue 58: Ctrl-C during the checkpoint's write left
  `NEW.importing/checkpoints/0.orbax-checkpoint-tmp` behind, while import.py said nothing was
  written."""
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(checkpoint.Checkpointer, 'save', interrupted)
  with pytest.raises(KeyboardInterrupt):
    import_checkpoint(built['marian'][0], str(tmp_path / 'new'))
  assert os.listdir(tmp_path) == []
