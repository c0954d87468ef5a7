"""Tokenizers: sentencepiece (trained on the train split) and characters; and the imported
checkpoints' (input_pipeline.pretrained_tokenizers: loaded from the workdir, never trained).

Both are saved in `workdir/tokenizer/` (`tokenizer.json` + `spm.model`) so a
resumed run and `decode.py` reuse them with nothing but the workdir. `checksums.json` beside
them holds their sha256, checked on every load: a changed byte (which would silently change
how text is tokenised) raises `TokenizerChecksumError` naming the file, and so does a
tokenizer whose checksums are gone (saved before checksums existed, or a damaged key).
`check_vocabulary` checks a workdir's tokenizer against the config its model was built from.

Common interface:
  encode(text, target=False)    -> list[int]; sentencepiece appends EOS (1), char does not;
                                `target`: the target side's segmentation (Marian's own)
  decode(ids) -> str            stops at the first EOS, drops pad (0)
  vocab_size: int               including pad
  id_to_piece(i) -> str         for attention-plot labels
  pad_id = 0, eos_id (1; None for char: its id 1 is a character)
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from common.files import read_regular
from common.tokens import EOS_ID, PAD_ID, PRETRAINED_TOKENIZERS, TOKENIZERS, UNK_ID
from input_pipeline import pretrained_tokenizers, subword_sampling, tokenizer_files
from input_pipeline.errors import DataError, DataFileError
from input_pipeline.tokenizer_files import TokenizerChecksumError  # noqa: F401  (public)

log = logging.getLogger(__name__)

TOKENIZER_DIR = 'tokenizer'
_SPM_MODEL = 'spm.model'
# `check_vocabulary`'s advice where a workdir is restored (decode.py, export.py, inference.load).
NOT_THE_MODELS = "it is not the tokenizer this model was trained with (restore the workdir's own)"


class SentencePieceTokenizer:
  """pad=0, eos=1, unk=2, no BOS; identity normalization (round-trips raw text)."""

  name = 'sentencepiece'  # its config.data.tokenizer
  pad_id = PAD_ID
  eos_id = EOS_ID
  unk_id = UNK_ID

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = int(self._sp.get_piece_size())
    self._sampler = None  # built on the first sample_batch

  def encode(self, text: str, target: bool = False) -> list[int]:
    del target  # one model for both sides
    return self._sp.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    del target
    return [ids + [EOS_ID] for ids in self._sp.encode(list(texts))]

  def sample_batch(self, texts: Sequence[str], *, alpha: float, nbest_size: int, seed: int
                   ) -> list[list[int]]:
    """`encode_batch` with a segmentation sampled for each text (subword regularisation; for a
    BPE model, BPE-dropout with merge-dropout probability `alpha`), decided by `seed` alone,
    in any process (input_pipeline.subword_sampling: not sentencepiece's own sampler, whose
    seed does not carry across processes)."""
    if self._sampler is None:
      self._sampler = subword_sampling.Sampler(self.model_proto)
    normalized = [self._sp.normalize(t) for t in texts]
    return [ids + [EOS_ID] for ids in subword_sampling.sample_batch(
        self._sampler, normalized, seed, alpha, nbest_size)]

  def decode(self, ids: Iterable[int]) -> str:
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i != PAD_ID:
        out.append(i)
    return self._sp.decode(out)

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def save(self, directory: str) -> None:
    tokenizer_files.save(directory, tokenizer_files.META,
                         {tokenizer_files.NAME_KEY: self.name, 'vocab_size': self.vocab_size,
                          'model_file': _SPM_MODEL}, {_SPM_MODEL: self.model_proto})


class CharTokenizer:
  """Character vocabulary: id 0 = pad, the sorted characters take ids 1..N."""

  name = 'char'  # its config.data.tokenizer
  pad_id = PAD_ID
  eos_id = None  # no EOS: id 1 is a character

  def __init__(self, chars: Sequence[str]):
    self.chars = list(chars)
    self._ids = {c: i + 1 for i, c in enumerate(self.chars)}
    self.vocab_size = len(self.chars) + 1

  def encode(self, text: str, target: bool = False) -> list[int]:
    del target  # one vocabulary for both sides
    try:
      return [self._ids[c] for c in text]
    except KeyError as e:
      raise DataError(f'character {e.args[0]!r} is not in the character vocabulary '
                      f'({len(self.chars)} characters of the training split)') from None

  def decode(self, ids: Iterable[int]) -> str:
    n = len(self.chars)
    return ''.join(self.chars[i - 1] for i in np.asarray(ids).reshape(-1).tolist() if 0 < i <= n)

  def id_to_piece(self, i: int) -> str:
    i = int(i)
    return '<pad>' if i == 0 else self.chars[i - 1]

  def save(self, directory: str) -> None:
    tokenizer_files.save(directory, tokenizer_files.META,
                         {tokenizer_files.NAME_KEY: self.name, 'vocab_size': self.vocab_size,
                          'chars': self.chars})


Tokenizer = (SentencePieceTokenizer | CharTokenizer | pretrained_tokenizers.MarianTokenizer
             | pretrained_tokenizers.HuggingFaceTokenizer)


def fingerprint(tokenizer: Tokenizer) -> str:
  """A digest of everything that decides `tokenizer`'s ids (keys the cached token ids)."""
  digest = hashlib.sha256(tokenizer.name.encode() + b'\0')
  if isinstance(tokenizer, SentencePieceTokenizer):
    digest.update(tokenizer.model_proto)
  elif isinstance(tokenizer, CharTokenizer):
    digest.update(json.dumps(tokenizer.chars).encode())
  else:  # an imported model's: its files, its specials and its renumbering
    for name, data in sorted(tokenizer.files.items()):
      digest.update(name.encode() + b'\0' + data)
    digest.update(json.dumps(tokenizer.meta(), sort_keys=True, default=str).encode())
    digest.update(np.asarray(tokenizer.order, np.int64).tobytes())
  return digest.hexdigest()[:32]


def encode_all(tokenizer: Tokenizer, texts: Sequence[str], target: bool = False
               ) -> list[list[int]]:
  """`tokenizer.encode` of each text, batched where the tokenizer can (sentencepiece encodes
  a list on every core)."""
  batch = getattr(tokenizer, 'encode_batch', None)
  if batch is not None:
    return batch(texts, target=target)
  return [tokenizer.encode(t, target=target) for t in texts]


def _model_path(directory: str, meta_path: str, name) -> str:
  """`tokenizer.json`'s `model_file`: only a plain file name inside the tokenizer directory
  (a workdir is data: it must not make us read `../../x` or `/etc/...`)."""
  if (not isinstance(name, str) or not name or name in ('.', '..') or '/' in name
      or (os.altsep and os.altsep in name) or os.sep in name):
    raise DataFileError(f'{meta_path}: model_file={name!r} must be a plain file name in '
                        f'{directory}')
  path = os.path.join(directory, name)
  if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
    raise DataFileError(f'{meta_path}: model_file={name!r} leads outside {directory}')
  return path


def train_sentencepiece(sentences: Iterable[str], vocab_size: int, *,
                        model_type: str = 'bpe', what: str = 'the training split'
                        ) -> SentencePieceTokenizer:
  """Trains sentencepiece on `sentences` (deterministic for a given input order).

  Identity normalization and `remove_extra_whitespaces=False` keep raw text
  (no-break spaces, tabs, double spaces) intact; byte fallback covers
  characters outside the vocabulary, so any text round-trips.
  """
  model = io.BytesIO()
  start = time.time()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model,
        vocab_size=vocab_size, model_type=model_type,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        normalization_rule_name='identity', remove_extra_whitespaces=False,
        character_coverage=1.0, byte_fallback=True,
        input_sentence_size=0, max_sentence_length=1 << 16,
        num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    msg = ' '.join(str(e).split())
    m = re.search(r'smaller than required_chars\. \d+ vs (\d+)', msg)
    if m:
      raise DataError(f'config.data.vocab_size={vocab_size} is too small for {what}: '
                      f'sentencepiece needs at least {m.group(1)} (256 byte-fallback pieces, '
                      'the characters and the special ids)') from None
    if 'Vocabulary size' in msg or 'vocab_size' in msg:
      m = re.search(r'<= (\d+)', msg)
      hint = f'sentencepiece allows at most {m.group(1)}' if m else msg
      raise DataError(f'config.data.vocab_size={vocab_size} is too large for {what}: '
                      f'{hint}') from None
    raise DataError(f'sentencepiece training on {what} failed: {msg}') from None
  log.info('Trained sentencepiece (%s, vocab %d) in %.1fs', model_type, vocab_size,
           time.time() - start)
  return SentencePieceTokenizer(model.getvalue())


def build_char_vocab(texts: Iterable[str]) -> CharTokenizer:
  chars = set()
  for text in texts:
    chars.update(text)
  if not chars:
    raise DataError('cannot build a character vocabulary from an empty training split')
  return CharTokenizer(sorted(chars))


def load_tokenizer(workdir: str) -> Tokenizer:
  """The tokenizer saved in `workdir/tokenizer/` (needs nothing else), its files checked against
  their checksums (`TokenizerChecksumError`)."""
  directory = os.path.join(os.fspath(workdir), TOKENIZER_DIR)
  meta_path = os.path.join(directory, tokenizer_files.META)
  if not os.path.isfile(meta_path):
    raise DataFileError(f'no tokenizer in workdir: {meta_path} not found')
  try:  # the bytes that are checked are the bytes that are parsed; regular files only (a
    # FIFO planted there would block an open() forever)
    files = {tokenizer_files.META: read_regular(meta_path)}
    meta = json.loads(files[tokenizer_files.META])
    name = meta[tokenizer_files.NAME_KEY]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataFileError(f'cannot read tokenizer {meta_path}: {type(e).__name__}: {e}') from None
  names = ([meta.get('model_file')] if name == 'sentencepiece' else
           list(pretrained_tokenizers.FILES.get(name, ())))
  for file_name in names:
    path = _model_path(directory, meta_path, file_name)
    try:
      files[file_name] = read_regular(path)
    except OSError as e:
      raise DataFileError(f'cannot read tokenizer {meta_path}: {type(e).__name__}: {e}') from None
  tokenizer_files.check(directory, meta, files, tokenizer_files.META)
  try:
    if name in PRETRAINED_TOKENIZERS:
      return pretrained_tokenizers.from_files(name, meta, files)
    if name == 'char':
      return CharTokenizer(meta['chars'])
    if name == 'sentencepiece':
      return SentencePieceTokenizer(files[names[0]])
  except (ValueError, KeyError, TypeError, RuntimeError) as e:
    raise DataFileError(f'cannot read tokenizer {meta_path}: {type(e).__name__}: {e}') from None
  raise DataError(f'unknown tokenizer {name!r} in {meta_path}')


def has_tokenizer(workdir: str | None) -> bool:
  return bool(workdir) and os.path.isfile(
      os.path.join(workdir, TOKENIZER_DIR, tokenizer_files.META))


def workdir_lock(workdir: str):
  """Exclusive lock so that processes sharing a workdir train the tokenizer once (a context
  manager; a symlink at its lock file is refused, never followed)."""
  return tokenizer_files.lock(os.path.join(workdir, TOKENIZER_DIR, '.lock'))


def _training_texts(data_config, max_sentences: int, whole_documents: bool = False
                    ) -> Iterator[str]:
  """Sentences of the train split for sentencepiece: both sides for translation.

  At most `max_sentences` sentences (a pair gives two), from examples evenly strided over the
  split (deterministic). sentencepiece holds them all while it trains: this bounds its memory
  (about 1 GB for a million WMT-length sentences).
  """
  from input_pipeline import sources  # tfds: only training a tokenizer reads the data
  source = sources.get_source(data_config, 'train')
  keys = sources.text_keys(data_config)
  n = len(source)
  examples = max(1, max_sentences // len(keys)) if max_sentences else 0
  stride = max(1, math.ceil(n / examples)) if examples else 1
  indices = range(0, n, stride)
  read_range = getattr(source, 'read_range', None)  # your own files: read through, not mapped
  for start in range(0, len(indices), 4096):
    part = indices[start:start + 4096]
    examples = (sources.read_examples(source, part) if read_range is None
                else read_range(part[0], part[-1] + 1)[::stride])
    for example in examples:
      for key in keys:
        text = sources.as_str(example[key])
        if len(keys) == 1 and not whole_documents:  # a document: train on its lines
          yield from (line for line in text.split('\n') if line.strip())
        elif data_config.dataset == 'text_files':  # a line: with the newline that ends it
          yield text + '\n'  # (a character vocabulary's separator: token_cache.line_end)
        else:
          yield text


def vocabulary_mismatch(tokenizer, data_config, model_vocab_size: int | None = None
                        ) -> str | None:
  """Why `tokenizer` cannot be the one a model of `data_config` (`model_vocab_size` ids; None:
  unchecked) was trained with, or None. A model trained with another tokenizer (another
  workdir's, say) decodes garbage without any error, so: its kind is config.data.tokenizer,
  sentencepiece has config.data.vocab_size pieces (what it was trained with) and no id lies
  past the model's embedding."""
  size, name = tokenizer.vocab_size, data_config.get('tokenizer', 'sentencepiece')
  if tokenizer.name != name:
    return (f'is a {tokenizer.name} tokenizer of {size} ids but config.data.tokenizer={name!r} '
            f'(config.data.vocab_size={data_config.vocab_size})')
  if name == 'sentencepiece' and size != data_config.vocab_size:
    return f'has {size} pieces but config.data.vocab_size={data_config.vocab_size}'
  if model_vocab_size is not None and size > model_vocab_size:
    return (f'has {size} ids but config.model.vocab_size={model_vocab_size} (ids past '
            f'{model_vocab_size - 1} have no embedding)')
  return None


def check_vocabulary(tokenizer, data_config, model_vocab_size: int | None, workdir: str,
                     hint: str) -> None:
  """Raises `DataError`, one line naming `workdir`'s tokenizer file, both sizes and `hint`
  (what to do), when `vocabulary_mismatch` finds a problem."""
  problem = vocabulary_mismatch(tokenizer, data_config, model_vocab_size)
  if problem:
    path = os.path.join(os.fspath(workdir), TOKENIZER_DIR, tokenizer_files.META)
    raise DataError(f'the tokenizer {path} {problem}: {hint}')


def get_tokenizer(data_config, workdir: str | None, model_vocab_size: int | None = None
                  ) -> Tokenizer:
  """The tokenizer saved in `workdir` (checked by `check_vocabulary` against `data_config` and
  `model_vocab_size`), else one trained on the train split (and saved).

  sentencepiece: `data_config.vocab_size` pieces (pad=0, eos=1, unk=2, no
  BOS), shared by source and target. char: sorted characters of the train
  split (ids 1..N). With `workdir=None` nothing is saved.
  """
  name = data_config.get('tokenizer', 'sentencepiece')
  if name not in TOKENIZERS + PRETRAINED_TOKENIZERS:  # a config from Python, never validated
    raise DataError(f"config.data.tokenizer must be 'sentencepiece' or 'char', got {name!r}")
  if workdir is None:
    return _train(data_config, name)
  with workdir_lock(workdir):
    if has_tokenizer(workdir):
      tokenizer = load_tokenizer(workdir)
      check_vocabulary(tokenizer, data_config, model_vocab_size, workdir,
                       'the workdir was trained with another config; use a new workdir')
      return tokenizer
    _refuse_retraining(workdir)
    if name in PRETRAINED_TOKENIZERS:
      raise DataError(f'config.data.tokenizer={name!r} comes with an imported model and is never '
                      f'trained; {workdir} has none: start from the imported workdir '
                      '(--config.train.init_from=DIR)')
    tokenizer = _shared(data_config, name)
    tokenizer.save(os.path.join(workdir, TOKENIZER_DIR))
    log.info('Saved %s tokenizer (vocab %d) in %s', name, tokenizer.vocab_size, workdir)
    return tokenizer


def _shared(data_config, name: str) -> Tokenizer:
  """The tokenizer trained on this train split with these settings, trained once per data dir
  and copied into each new workdir: a sweep's runs, or a new run on a prepared corpus, do not
  train sentencepiece again (minutes on a million sentences). It is the tokenizer `_train`
  gives (training is deterministic for a given input); its files are checksummed like a
  workdir's, and a damaged one is trained again."""
  from input_pipeline import sources  # tfds: only training a tokenizer reads the data
  settings = [name, sources.split_fingerprint(data_config, 'train'),
              data_config.get('tokenizer_max_sentences', 0) or 0]
  if name == 'sentencepiece':
    settings += [data_config.vocab_size, data_config.get('tokenizer_model_type', 'bpe') or 'bpe']
  digest = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
  data_dir = sources.resolve_data_dir(data_config.get('data_dir'))
  cache = os.path.join(data_dir, 'tokenizers', re.sub(r'[^\w.-]+', '_', data_config.dataset),
                       f'{name}-{digest}')
  with workdir_lock(cache):
    if has_tokenizer(cache):
      try:
        return load_tokenizer(cache)
      except DataError as e:
        log.warning('Training the tokenizer again: the shared copy is unusable (%s)', e)
    print(f'training the {name} tokenizer on the train split of {data_config.dataset!r} '
          f'(kept in {cache}) ...', flush=True)
    start = time.time()
    tokenizer = _train(data_config, name)
    print(f'trained the {name} tokenizer ({tokenizer.vocab_size:,} ids) in '
          f'{time.time() - start:.1f}s', flush=True)
    try:
      tokenizer.save(os.path.join(cache, TOKENIZER_DIR))
    except DataError as e:  # a cache: the run goes on with the tokenizer it trained
      log.warning('Could not keep a shared copy of the tokenizer: %s', e)
    return tokenizer


def _refuse_retraining(workdir: str) -> None:
  """A workdir with checkpoints but no tokenizer: a new one could number the pieces
  differently from the one the checkpoints were trained with, so it is not retrained."""
  checkpoints = os.path.join(workdir, 'checkpoints')
  names = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
  if any(name.isdigit() for name in names):
    meta_path = os.path.join(workdir, TOKENIZER_DIR, tokenizer_files.META)
    raise DataError(f'{workdir} has checkpoints but no tokenizer ({meta_path} is missing); a '
                    'retrained tokenizer could number the pieces differently, so restore that '
                    'folder or use a new workdir')


def _train(data_config, name: str) -> Tokenizer:
  max_sentences = data_config.get('tokenizer_max_sentences', 0) or 0
  texts = _training_texts(data_config, max_sentences, whole_documents=name == 'char')
  if name == 'char':
    return build_char_vocab(texts)
  return train_sentencepiece(
      texts, data_config.vocab_size,
      model_type=data_config.get('tokenizer_model_type', 'bpe') or 'bpe',
      what=f'the train split of {data_config.dataset!r}')
