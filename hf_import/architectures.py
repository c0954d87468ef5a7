"""The `transformers` classes import.py reads: one `Architecture` per class, in one table.

  MarianMTModel    -> encoder_decoder, post-LN, sinusoidal, scaled embeddings  + 'marian' tokenizer
  GPT2LMHeadModel  -> decoder_only, pre-LN, learned positions, tied output     + 'huggingface'
  BertModel        -> encoder_only, post-LN, learned positions, embedding_norm + 'huggingface'

Each row turns the checkpoint's config.json (a dict) and state dict into `config.model` fields
and our parameters. A config field or value our modules cannot express is refused with one
line naming it (`Unsupported`), never approximated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from hf_export.convert import HF_ACTIVATIONS
from hf_import import convert
from model.kinds import ADAPTERS

ACTIVATIONS = {hf: ours for ours, hf in HF_ACTIVATIONS.items()} | {
    'silu': 'silu', 'gelu_pytorch_tanh': 'gelu'}
# Marian and Pegasus hard-code torch's LayerNorm default.
TORCH_LAYER_NORM_EPS = 1e-5


class Unsupported(ValueError):
  """The checkpoint uses something our model cannot express; the message names it."""


def _refuse(field: str, value, why: str):
  raise Unsupported(f'config.json {field}={value!r} cannot be imported: {why}')


def _require(hf: dict, field: str, allowed: tuple, why: str, default=None):
  value = hf.get(field, default)
  if value not in allowed:
    _refuse(field, value, why)
  return value


def _activation(hf: dict, field: str) -> str:
  value = hf.get(field, 'gelu')
  if not isinstance(value, str) or value not in ACTIVATIONS:
    _refuse(field, value, f'the feed-forward activations are {", ".join(sorted(ACTIVATIONS))}')
  return ACTIVATIONS[value]


def _same(hf: dict, a: str, b: str, what: str):
  if hf.get(a) != hf.get(b):
    _refuse(b, hf.get(b), f'{what} must equal {a}={hf.get(a)!r} (one value for both stacks)')
  return hf.get(a)


def _bias_needed(bias: np.ndarray, pad: int) -> bool:
  """Whether Marian's final_logits_bias adds anything but a mask on pad (never generated)."""
  rest = np.delete(bias.reshape(-1), pad)
  return bool(np.any(rest != 0))


def marian_model(hf: dict, sd: dict) -> dict:
  """MarianConfig -> `config.model` fields."""
  pad = hf.get('pad_token_id')
  start = hf.get('decoder_start_token_id', pad)
  if start != pad:
    _refuse('decoder_start_token_id', start, f'the decoder starts from pad ({pad}) here')
  vocab = hf['vocab_size']
  if hf.get('decoder_vocab_size') not in (None, vocab):
    _refuse('decoder_vocab_size', hf['decoder_vocab_size'], f'one vocabulary of {vocab} ids '
            'serves source and target here')
  _require(hf, 'normalize_before', (False,), 'Marian layers are post-LN', default=False)
  _require(hf, 'add_bias_logits', (False,), 'only final_logits_bias is carried', default=False)
  shared = bool(hf.get('share_encoder_decoder_embeddings', True))
  tied = bool(hf.get('tie_word_embeddings', True))
  heads = _same(hf, 'encoder_attention_heads', 'decoder_attention_heads', 'the head count')
  ffn = _same(hf, 'encoder_ffn_dim', 'decoder_ffn_dim', 'the feed-forward width')
  return dict(
      kind='encoder_decoder', vocab_size=vocab, d_model=hf['d_model'], num_heads=heads,
      d_ff=ffn, num_encoder_layers=hf['encoder_layers'], num_decoder_layers=hf['decoder_layers'],
      max_len=hf['max_position_embeddings'], positional_encoding='sinusoidal',
      norm_position='post', activation=_activation(hf, 'activation_function'),
      scale_embeddings=bool(hf.get('scale_embedding', False)),
      share_embeddings=shared, logits_via_embedding=tied and shared,
      final_logits_bias=tied and shared and _bias_needed(sd['final_logits_bias'], pad),
      layer_norm_epsilon=TORCH_LAYER_NORM_EPS, dropout_rate=float(hf.get('dropout', 0.1)),
      attention_dropout_rate=float(hf.get('attention_dropout', 0.0)),
      activation_dropout_rate=float(hf.get('activation_dropout', 0.0)))


def gpt2_model(hf: dict, sd: dict) -> dict:
  """GPT2Config -> `config.model` fields."""
  del sd
  d = hf['n_embd']
  _require(hf, 'scale_attn_weights', (True,), 'attention scores are divided by sqrt(d_k)',
           default=True)
  _require(hf, 'scale_attn_by_inverse_layer_idx', (False,), 'every layer scales alike',
           default=False)
  _require(hf, 'tie_word_embeddings', (True,), 'the output layer is the embedding here',
           default=True)
  return dict(
      kind='decoder_only', vocab_size=hf['vocab_size'], d_model=d, num_heads=hf['n_head'],
      d_ff=hf.get('n_inner') or 4 * d, num_encoder_layers=0, num_decoder_layers=hf['n_layer'],
      max_len=hf['n_positions'], positional_encoding='learned', norm_position='pre',
      activation=_activation(hf, 'activation_function'), scale_embeddings=False,
      share_embeddings=True, logits_via_embedding=True, init='gpt2',
      layer_norm_epsilon=float(hf.get('layer_norm_epsilon', 1e-5)),
      dropout_rate=float(hf.get('resid_pdrop', 0.1)),
      attention_dropout_rate=float(hf.get('attn_pdrop', 0.1)))


def bert_model(hf: dict, sd: dict) -> dict:
  """BertConfig -> `config.model` fields."""
  del sd
  _require(hf, 'position_embedding_type', ('absolute',), 'positions are absolute here',
           default='absolute')
  _require(hf, 'is_decoder', (False,), 'this is the encoder-only import', default=False)
  return dict(
      kind='encoder_only', vocab_size=hf['vocab_size'], d_model=hf['hidden_size'],
      num_heads=hf['num_attention_heads'], d_ff=hf['intermediate_size'],
      num_encoder_layers=hf['num_hidden_layers'], num_decoder_layers=0,
      max_len=hf['max_position_embeddings'], positional_encoding='learned',
      norm_position='post', activation=_activation(hf, 'hidden_act'), scale_embeddings=False,
      embedding_norm=True, layer_norm_epsilon=float(hf.get('layer_norm_eps', 1e-12)),
      dropout_rate=float(hf.get('hidden_dropout_prob', 0.1)),
      attention_dropout_rate=float(hf.get('attention_probs_dropout_prob', 0.1)))


def gpt2_specials(hf: dict) -> tuple[int | None, int | None]:
  """GPT-2's BOS (<|endoftext|>) starts every text, as our pad does; it is also its EOS,
  which we then leave out (a text cannot end with its start token)."""
  start, eos = hf.get('bos_token_id'), hf.get('eos_token_id')
  return start, None if eos == start else eos


def bert_specials(hf: dict) -> tuple[int | None, int | None]:
  """An encoder: its pad id is ours, and it has no EOS."""
  return hf.get('pad_token_id', 0), None


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One `transformers` class and how it becomes our model."""
  name: str  # config.architectures[0]
  model: Callable  # (config.json dict, state dict) -> config.model fields
  params: Callable  # (state dict, ModelConfig, vocab order) -> our params
  tokenizer: str  # the tokenizer kind it comes with (input_pipeline.tokenizers)
  # config.json's token ids the conversion reads: each must be a token id of the model.
  token_ids: tuple[str, ...]
  # tokenizer.json's model type ('huggingface' tokenizers): another is another model's.
  tokenizer_model: str | None = None
  # ('huggingface' tokenizers) config.json -> (the id that becomes our pad and start token,
  # the EOS id or None).
  specials: Callable[[dict], tuple[int | None, int | None]] | None = None
  # A prefix the weights may carry (a BertForMaskedLM checkpoint keeps its encoder under
  # 'bert.'): dropped on reading.
  prefix: str = ''


ARCHITECTURES = {a.name: a for a in (
    Architecture('MarianMTModel', marian_model, convert.marian_params, 'marian',
                 ('pad_token_id', 'eos_token_id')),
    Architecture('GPT2LMHeadModel', gpt2_model, convert.gpt2_params, 'huggingface',
                 ('bos_token_id',), 'BPE', gpt2_specials),
    Architecture('BertModel', bert_model, convert.bert_params, 'huggingface', ('pad_token_id',),
                 'WordPiece', bert_specials, prefix='bert.'),
)}
# transformers' GenerationConfig defaults for what a generation_config.json leaves out (theirs,
# not decode.py's: those are in autoregressive.strategies).
TRANSFORMERS_SAMPLING = {'temperature': 1.0, 'top_k': 50}


def decode_settings(generation: dict, kind: str, max_len: int) -> dict:
  """generation_config.json -> `config.decode` fields: the inverse of what export.py writes
  (hf_export.targets), so a round trip keeps them. A translation model's beam size, length
  penalty (carried as alpha, as the export writes alpha: transformers divides by
  len ** length_penalty where decode.py uses ((5 + len) / 6) ** alpha) and new-token bounds
  (max_length counts the decoder's start token); a language model's sampling settings
  (do_sample off: greedy, our temperature 0). A field it leaves out keeps our default."""
  out = {}
  if 'min_new_tokens' in generation:
    out['min_new_tokens'] = generation['min_new_tokens']
  if ADAPTERS[kind].has_decoder and not ADAPTERS[kind].has_source:  # a language model
    if not generation.get('do_sample', False):
      return {**out, 'temperature': 0.0}  # greedy
    theirs = {**TRANSFORMERS_SAMPLING, **generation}
    return {**out, 'temperature': theirs['temperature'], 'top_k': theirs['top_k']}
  for field, ours in (('num_beams', 'beam_size'), ('length_penalty', 'alpha')):
    if field in generation:
      out[ours] = generation[field]
  new = generation.get('max_new_tokens')
  if new is None and isinstance(generation.get('max_length'), int):
    new = generation['max_length'] - 1
  if isinstance(new, int) and not isinstance(new, bool):
    out['max_new_tokens'] = min(new, max_len)
  elif new is not None:
    out['max_new_tokens'] = new  # refused, with its name, by config.decode's checks
  return out


# Optional ids: checked where config.json gives them.
OPTIONAL_TOKEN_IDS = ('pad_token_id', 'bos_token_id', 'eos_token_id', 'decoder_start_token_id')
# BertConfig's default pad id, where config.json leaves it out.
DEFAULT_TOKEN_IDS = {'BertModel': {'pad_token_id': 0}}


def token_ids(hf: dict, arch: Architecture) -> None:
  """Every token id config.json gives (and each the conversion needs) is an integer below
  its vocab_size, else `Unsupported` naming it: a pad id of 9999 or null would otherwise be a
  traceback, or an embedding row that does not exist."""
  vocab = hf.get('vocab_size')
  if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
    _refuse('vocab_size', vocab, 'it must be a positive integer')
  defaults = DEFAULT_TOKEN_IDS.get(arch.name, {})
  for field in dict.fromkeys((*arch.token_ids, *OPTIONAL_TOKEN_IDS)):
    if field not in hf and field in defaults:
      continue
    value = hf.get(field)
    if value is None and field not in arch.token_ids:
      continue
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
      _refuse(field, value, f'{arch.name} needs it' if value is None else
              f'token ids are integers from 0 to vocab_size - 1 = {vocab - 1}')


def architecture(hf: dict) -> Architecture:
  """The row of config.json's `architectures`, or `Unsupported` naming it."""
  names = hf.get('architectures') or []
  if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
    _refuse('architectures', names, 'it must be a list of class names')
  for name in names:
    if name in ARCHITECTURES:
      return ARCHITECTURES[name]
  _refuse('architectures', names, f'import.py reads {", ".join(ARCHITECTURES)}')
