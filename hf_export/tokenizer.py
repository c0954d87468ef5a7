"""Our workdir tokenizer -> `transformers` tokenizer files that give our ids.

  sentencepiece  -> MarianTokenizer (source.spm = target.spm = our model, vocab.json = its
                    pieces by id): `tokenizer(text)` = our `encode(text)` (pieces + EOS 1).
                    `model_max_length` is the model's max_len and truncation cuts on the
                    right, so `tokenizer(lines, truncation=True)` cuts a long line as decode.py
                    does (its first max_len - 1 pieces, then EOS). transformers (5.x) has no
                    setting that makes truncation the default: without `truncation=True` such
                    a line reaches the model whole (transformers warns that it is longer than
                    model_max_length), and the model runs it: Marian and Pegasus are exported
                    with `convert.position_count` (>= 1024) positions.
  marian, huggingface (imported: input_pipeline.pretrained_tokenizers) -> the files they came
                    from, renumbered as our ids (the model's rows are in our order too)
  char           -> PreTrainedTokenizerFast over a `tokenizers` WordLevel vocabulary of our
                    characters (`<pad>` = 0, characters 1..N), one token per character. For a
                    language model it prepends the start token 0 (as BOS), which is what our
                    decoder reads before the first character; a character outside the
                    vocabulary is an error, as in ours.

`save_tokenizer` writes into a directory through the classes' own `save_pretrained`, so
`AutoTokenizer.from_pretrained(dir)` reads the files back.
"""

from __future__ import annotations

import json
import os
import tempfile

PAD = '<pad>'


def save_tokenizer(tokenizer, directory: str, *, max_len: int, start_token: bool) -> str:
  """Writes the tokenizer files for our `tokenizer` into `directory`; returns the class name.

  `max_len` is the model's position count (the tokenizer's `model_max_length`); `start_token`:
  a character tokenizer prepends the start token 0 (a decoder-only model's BOS).
  """
  if tokenizer.name == 'sentencepiece':
    return _save_marian(tokenizer, directory, max_len)
  if tokenizer.name == 'marian':
    return _save_imported_marian(tokenizer, directory, max_len)
  if tokenizer.name == 'huggingface':
    return _save_imported_fast(tokenizer, directory, max_len)
  return _save_chars(tokenizer, directory, max_len, start_token=start_token)


def _save_imported_marian(tokenizer, directory: str, max_len: int) -> str:
  """An imported MarianTokenizer's own files, its vocab.json renumbered as our ids."""
  from transformers import MarianTokenizer  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as scratch:
    paths = {name: os.path.join(scratch, name) for name in tokenizer.files}
    for name, data in tokenizer.files.items():
      with open(paths[name], 'wb') as f:
        f.write(data)
    with open(paths['vocab.json'], 'w', encoding='utf-8') as f:
      json.dump(tokenizer.vocab, f, ensure_ascii=False)
    special = {f'{key}_token': value for key, value in tokenizer.specials.items()}
    MarianTokenizer(paths['source.spm'], paths['target.spm'], paths['vocab.json'],
                    model_max_length=max_len, truncation_side='right', padding_side='right',
                    **special).save_pretrained(directory)
  return 'MarianTokenizer'


def _save_imported_fast(tokenizer, directory: str, max_len: int) -> str:
  """An imported tokenizer.json (GPT-2's BPE), renumbered as our ids; pad is our id 0."""
  from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.renumbered_json()),
                          model_max_length=max_len, pad_token=tokenizer.id_to_piece(0),
                          clean_up_tokenization_spaces=False).save_pretrained(directory)
  return 'PreTrainedTokenizerFast'



def _save_marian(tokenizer, directory: str, max_len: int) -> str:
  from transformers import MarianTokenizer  # pylint: disable=import-outside-toplevel

  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  vocab = {piece: i for i, piece in enumerate(pieces)}
  if len(vocab) != len(pieces):
    raise ValueError('the sentencepiece model has repeated pieces; vocab.json would be ambiguous')
  # MarianTokenizer reads its files from paths: stage them in a scratch directory.
  with tempfile.TemporaryDirectory() as scratch:
    spm_path = os.path.join(scratch, 'spm.model')
    vocab_path = os.path.join(scratch, 'vocab.json')
    with open(spm_path, 'wb') as f:
      f.write(tokenizer.model_proto)
    with open(vocab_path, 'w', encoding='utf-8') as f:
      json.dump(vocab, f, ensure_ascii=False)
    hf = MarianTokenizer(
        source_spm=spm_path, target_spm=spm_path, vocab=vocab_path, unk_token='<unk>',
        eos_token='</s>', pad_token=PAD, model_max_length=max_len, truncation_side='right',
        padding_side='right', clean_up_tokenization_spaces=False, split_special_tokens=True)
    hf.save_pretrained(directory)
  return 'MarianTokenizer'


def char_tokenizer_object(chars, *, start_token: bool):
  """A `tokenizers.Tokenizer`: one token per character, ids as ours (`<pad>` = 0)."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # pylint: disable=import-outside-toplevel

  vocab = {PAD: 0, **{c: i + 1 for i, c in enumerate(chars)}}
  # No unknown token in the vocabulary: an unknown character raises instead of being mapped.
  tok = Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r'[\s\S]'), behavior='isolated')
  tok.decoder = decoders.Fuse()
  if start_token:
    tok.post_processor = processors.TemplateProcessing(
        single=f'{PAD} $A', pair=f'{PAD} $A $B', special_tokens=[(PAD, 0)])
  return tok


def _save_chars(tokenizer, directory: str, max_len: int, *, start_token: bool) -> str:
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  special = {'pad_token': PAD}
  if start_token:
    special['bos_token'] = PAD  # our start token is the pad id 0
  hf = PreTrainedTokenizerFast(
      tokenizer_object=char_tokenizer_object(tokenizer.chars, start_token=start_token),
      model_max_length=max_len, clean_up_tokenization_spaces=False, split_special_tokens=True,
      **special)
  hf.save_pretrained(directory)
  return 'PreTrainedTokenizerFast'
