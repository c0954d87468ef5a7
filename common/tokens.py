"""The token ids every part of the project agrees on, and the one truncation rule.

Token id 0 is padding everywhere (masked as keys, ignored by the loss, the decoder's start
token); sentencepiece vocabularies use pad=0, eos=1, unk=2 and no BOS. A character
vocabulary has no EOS (its `eos_id` is None): id 1 is a character there.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
# The generated tokens an output has at least before EOS may end it (every search, every model
# kind; config.decode.min_new_tokens). 1 forbids the empty output, which a translation model
# often scores best (Stahlberg & Byrne 2019; fairseq's and CTranslate2's default too). A
# language model's prompt may be complete as it is, but an empty continuation answers nothing
# that was asked, so 1 there too. 0 lets EOS come first.
DEFAULT_MIN_NEW_TOKENS = 1
# config.data.tokenizer: the tokenizers the input pipeline trains, and the sentencepiece model
# types (config.data.tokenizer_model_type; 'bpe' is the paper's).
TOKENIZERS = ('sentencepiece', 'char')
# config.data.tokenizer of an imported model (import.py): read from its files, never trained.
PRETRAINED_TOKENIZERS = ('marian', 'huggingface')
SENTENCEPIECE_MODEL_TYPES = ('bpe', 'unigram')


def truncate(ids: Sequence[int], max_length: int, eos_id: int | None) -> list[int]:
  """At most `max_length` ids; a cut sequence keeps its EOS at the end (when there is one).

  The training pipeline and translation at inference cut sources by this one rule, so a
  model sees the same kind of input in both."""
  ids = list(ids)
  if len(ids) <= max_length:
    return ids
  return ids[:max_length - 1] + [eos_id] if eos_id is not None else ids[:max_length]
