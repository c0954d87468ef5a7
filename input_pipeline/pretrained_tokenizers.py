"""The tokenizers of imported checkpoints (import.py): loaded, never trained.

  marian       OPUS-MT's: a source and a target sentencepiece model and one joint vocab.json
               (MarianTokenizer's files), EOS appended
  huggingface  a `tokenizers` tokenizer.json (GPT-2's byte-level BPE, BERT's WordPiece), with
               its own post-processing ([CLS] ... [SEP] for BERT; nothing for GPT-2)

A checkpoint numbers its tokens its own way (Marian: pad is the last id, EOS 0); ours puts pad
at 0, EOS at 1 and unk at 2 (common.tokens). `order` is the checkpoint's ids in our id order
(`hf_import.convert.vocab_order`): our id i is the checkpoint's `order[i]`, and the model's
embedding rows were permuted alike. Same interface as input_pipeline.tokenizers' (`encode`,
`decode`, `vocab_size`, `id_to_piece`, `pad_id`, `eos_id`, `save`); `encode(text,
target=True)` segments with the target side's model where there is one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from common.tokens import PAD_ID
from input_pipeline import tokenizer_files

# MarianTokenizer's language code prefix (">>de<<") of multilingual models: one token.
_LANGUAGE_CODE = re.compile(r'>>.+?<<')


class _Reordered:
  """Ids between the checkpoint's numbering and ours (`order`: checkpoint ids, ours first)."""

  pad_id = PAD_ID
  eos_id: int | None = None  # ours; a subclass sets it from the checkpoint's

  def __init__(self, order: Sequence[int]):
    self.order = np.asarray(order, np.int64)
    self._ours = np.empty_like(self.order)
    self._ours[self.order] = np.arange(len(self.order))
    self.vocab_size = len(self.order)

  def to_ours(self, ids: Iterable[int]) -> list[int]:
    return self._ours[np.asarray(list(ids), np.int64)].tolist()

  def to_theirs(self, ids: Iterable[int]) -> list[int]:
    """Our ids up to the first EOS, without pad -> the checkpoint's."""
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if self.eos_id is not None and i == self.eos_id:
        break
      if i != PAD_ID:
        out.append(int(self.order[i]))
    return out

  def encode_batch(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    return [self.encode(t, target=target) for t in texts]

  def save(self, directory: str) -> None:
    """Its files and the meta file naming it, as input_pipeline.tokenizers' save theirs."""
    tokenizer_files.save(directory, tokenizer_files.META,
                         {tokenizer_files.NAME_KEY: self.name, 'vocab_size': self.vocab_size,
                          **self.meta()}, self.files)


class MarianTokenizer(_Reordered):
  """MarianTokenizer's segmentation: source.spm (or target.spm) pieces, looked up in the joint
  vocab.json (unknown pieces: unk), then EOS."""

  name = 'marian'

  def __init__(self, source_spm: bytes, target_spm: bytes, vocab: dict[str, int],
               order: Sequence[int], specials: dict[str, str]):
    self.files = {'source.spm': source_spm, 'target.spm': target_spm,
                  'vocab.json': json.dumps(vocab, ensure_ascii=False).encode()}
    self.specials = dict(specials)  # {'eos': '</s>', 'unk': '<unk>', 'pad': '<pad>'}
    self._source = spm.SentencePieceProcessor(model_proto=source_spm)
    self._target = spm.SentencePieceProcessor(model_proto=target_spm)
    self._vocab = dict(vocab)
    self._pieces = {i: p for p, i in vocab.items()}
    self._unk = vocab[specials['unk']]
    self._eos = vocab[specials['eos']]
    super().__init__(order)
    self.eos_id = self.to_ours([self._eos])[0]

  def encode(self, text: str, target: bool = False) -> list[int]:
    code = _LANGUAGE_CODE.match(text)
    pieces = [code.group(0)] if code else []
    text = text[code.end():] if code else text
    pieces += (self._target if target else self._source).encode(text, out_type=str)
    return self.to_ours([self._vocab.get(p, self._unk) for p in pieces] + [self._eos])

  def decode(self, ids: Iterable[int]) -> str:
    """MarianTokenizer.decode(skip_special_tokens=True): the target model joins the pieces; a
    piece it lacks (the joint vocabulary's source pieces) keeps its '▁' as a space."""
    pieces = [self._pieces.get(i, '') for i in self.to_theirs(ids)]
    text = self._target.decode_pieces([p for p in pieces if p not in self.specials.values()])
    return text.replace('\u2581', ' ').strip()

  def id_to_piece(self, i: int) -> str:
    return self._pieces.get(int(self.order[int(i)]), f'<extra_id_{int(i)}>')

  @property
  def vocab(self) -> dict[str, int]:
    """Every piece's id, in our numbering (what an export's vocab.json holds)."""
    return {p: int(self._ours[i]) for p, i in self._vocab.items()}

  def meta(self) -> dict:
    return {'order': self.order.tolist(), 'specials': self.specials}


class HuggingFaceTokenizer(_Reordered):
  """A `tokenizers` tokenizer.json: its normalisation, pre-tokenisation, model and
  post-processing as the checkpoint's fast tokenizer does them (`add_special_tokens`)."""

  name = 'huggingface'

  def __init__(self, tokenizer_json: bytes, order: Sequence[int], eos: int | None):
    from tokenizers import Tokenizer  # the [hf] extra's; only an imported model reads it
    self.files = {'hf_tokenizer.json': tokenizer_json}
    self._tok = Tokenizer.from_str(tokenizer_json.decode())
    super().__init__(order)
    self._eos = eos  # the checkpoint's EOS id, or None (GPT-2's <|endoftext|> is our pad)
    if eos is not None:
      self.eos_id = self.to_ours([eos])[0]

  def encode(self, text: str, target: bool = False) -> list[int]:
    del target  # one model for both sides
    return self._text_ids(self._tok.encode(text).ids)

  def encode_batch(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    del target
    return [self._text_ids(e.ids) for e in self._tok.encode_batch(list(texts))]

  def _text_ids(self, ids: list[int]) -> list[int]:
    """Ours, without a leading start token: the tokenizer of a language model this project
    exported prepends it (as GPT-2's BOS), and our decoder reads it before the text anyway."""
    ours = self.to_ours(ids)
    while ours and ours[0] == PAD_ID:
      ours.pop(0)
    return ours

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode(self.to_theirs(ids), skip_special_tokens=True)

  def id_to_piece(self, i: int) -> str:
    return self._tok.id_to_token(int(self.order[int(i)])) or f'<extra_id_{int(i)}>'

  def meta(self) -> dict:
    return {'order': self.order.tolist(), 'eos': self._eos}

  def renumbered_json(self) -> str:
    """The tokenizer.json with our ids (vocabulary, added tokens, the post-processor's special
    tokens): what an export writes, so that it gives our ids."""
    data = json.loads(self.files['hf_tokenizer.json'])
    ours = self._ours.tolist()
    vocab = data['model'].get('vocab')
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel
      data['model']['vocab'] = {token: ours[i] for token, i in vocab.items()}
    elif isinstance(vocab, list):  # Unigram: [piece, score] by id
      data['model']['vocab'] = [vocab[i] for i in self.order]
    for token in data.get('added_tokens') or []:
      token['id'] = ours[token['id']]
    _renumber_processor(data.get('post_processor'), ours)
    return json.dumps(data, ensure_ascii=False)


def _renumber_processor(processor, ours: list[int]) -> None:
  """The special token ids of a tokenizer.json post-processor, in place."""
  if not isinstance(processor, dict):
    return
  for inner in processor.get('processors') or []:  # a Sequence
    _renumber_processor(inner, ours)
  for special in (processor.get('special_tokens') or {}).values():  # TemplateProcessing
    special['ids'] = [ours[i] for i in special['ids']]
  for key in ('sep', 'cls'):  # BertProcessing, RobertaProcessing: [token, id]
    if isinstance(processor.get(key), list):
      processor[key] = [processor[key][0], ours[processor[key][1]]]


def from_files(name: str, meta: dict, files: dict[str, bytes]):
  """The tokenizer `name` from its saved `meta` and `files` (what `save` wrote)."""
  if name == 'marian':
    return MarianTokenizer(files['source.spm'], files['target.spm'],
                           json.loads(files['vocab.json']), meta['order'], meta['specials'])
  return HuggingFaceTokenizer(files['hf_tokenizer.json'], meta['order'], meta['eos'])


FILES = {'marian': ('source.spm', 'target.spm', 'vocab.json'),
         'huggingface': ('hf_tokenizer.json',)}  # beside our tokenizer.json
