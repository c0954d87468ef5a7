"""The `transformers` classes our models export to: one `Target` per class, in one table.

  (kind, norm_position)             target
  (encoder_decoder, post)           MarianMTModel                   + MarianTokenizer
  (encoder_decoder, pre)            PegasusForConditionalGeneration + MarianTokenizer
  (decoder_only,    pre)            GPT2LMHeadModel                 + a character tokenizer
  (encoder_only,    post)           BertModel                       + its imported tokenizer

BertModel is the target of an encoder-only model that BERT computes exactly: LayerNormed
embeddings (`embedding_norm`), learned positions, no embedding scale, and the tokenizer it was
imported with ('huggingface'); ours ('sentencepiece', 'char') have no BERT tokenizer writer.
It has no generation head, so no generation_config.json. BertModel always builds a pooler,
which is not part of our model: it is written as zeros (its output, tanh(0), means nothing),
so that transformers loads every weight from the file and warns about none.

A model no row matches, or one a row's `check` refuses, is refused by `check_exportable` with
one line naming the feature. Adding a target is one row here plus its conversion in `convert`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from configs.schema import DecodeConfig
from hf_export import convert
from model.kinds import adapter_of


class UnsupportedConfig(ValueError):
  """No `transformers` class computes this model exactly; the message names the feature."""


def _refuse(feature: str, why: str):
  raise UnsupportedConfig(f'config.model.{feature} cannot be exported: {why}')


def check_layers(cfg, target: str) -> None:
  """What no export target computes: RMSNorm, QK-norm, relu2 and gated feed-forwards
  (their LayerNorms, attention and activations are the paper's and GELU/SiLU's)."""
  if cfg.norm != 'layer_norm':
    _refuse(f'norm={cfg.norm}', f'{target} normalises with LayerNorm only')
  if cfg.qk_norm:
    _refuse('qk_norm=True', f'{target} has no normalisation of queries and keys')
  if cfg.activation not in convert.HF_ACTIVATIONS:
    _refuse(f'activation={cfg.activation}', f'{target} has no {cfg.activation} feed-forward '
            f'(it takes {", ".join(convert.HF_ACTIVATIONS)})')


def _check_common(cfg) -> None:
  check_layers(cfg, 'transformers')
  if cfg.embedding_norm:
    _refuse('embedding_norm=True', 'MarianMTModel, PegasusForConditionalGeneration and '
            'GPT2LMHeadModel have no LayerNorm on the embeddings')


def _check_seq2seq(cfg) -> None:
  _check_common(cfg)
  if cfg.positional_encoding != 'sinusoidal':
    _refuse(f'positional_encoding={cfg.positional_encoding}', 'MarianMTModel and '
            'PegasusForConditionalGeneration add fixed sinusoidal positions only')
  if cfg.norm_position == 'pre' and not cfg.share_embeddings:
    _refuse('share_embeddings=False with norm_position=pre', 'PegasusForConditionalGeneration '
            '(the pre-LN target) has one embedding shared by encoder and decoder')


def _check_gpt2(cfg) -> None:
  _check_common(cfg)
  if cfg.final_logits_bias:
    _refuse('final_logits_bias=True (decoder_only)', "GPT2LMHeadModel's output layer has no "
            'bias')
  if cfg.positional_encoding == 'rope':
    _refuse('positional_encoding=rope (decoder_only)', 'GPT2LMHeadModel adds absolute '
            'position embeddings; it has no rotary embeddings')
  if not cfg.logits_via_embedding:
    _refuse('logits_via_embedding=False (decoder_only)', "GPT2LMHeadModel's output layer has "
            'no bias, and ours (a Dense layer) has one')


def _check_bert(cfg) -> None:
  check_layers(cfg, 'BertModel')
  if not cfg.embedding_norm:
    _refuse('embedding_norm=False (encoder_only)', 'BertModel, the encoder-only target, '
            'always LayerNorms its embeddings')
  if cfg.positional_encoding != 'learned':
    _refuse(f'positional_encoding={cfg.positional_encoding} (encoder_only)', 'BertModel adds '
            'a learned absolute position table only')
  if cfg.scale_embeddings:
    _refuse('scale_embeddings=True (encoder_only)', 'BertModel does not scale its embeddings')


def _beam_generation(cfg, eos: int | None, decode_config) -> dict:
  """Beam search as decode.py's: pad never generated, at least min_new_tokens tokens before
  EOS, and a sentence done only once no alive hypothesis can overtake the finished ones
  (early_stopping='never'; True would stop at num_beams finished, fairseq's rule).
  transformers divides by len ** length_penalty where decode.py uses the GNMT penalty
  ((5 + len) / 6) ** alpha: the same search when alpha = 0 (docs/guide.md's export)."""
  decode = DecodeConfig.from_config(decode_config)  # a missing field: its default
  max_new_tokens = min(decode.max_new_tokens, cfg.max_len)
  return dict(decoder_start_token_id=0, pad_token_id=0, eos_token_id=eos,
              forced_eos_token_id=None, suppress_tokens=[0], num_beams=decode.beam_size,
              length_penalty=decode.alpha, early_stopping='never',
              max_new_tokens=max_new_tokens,
              min_new_tokens=min(decode.min_new_tokens, max_new_tokens))


def _sampling_generation(cfg, eos: int | None, decode_config) -> dict:
  """decode.py's sampling (greedy at temperature 0); GPT-2 has max_len positions: the start
  token and the text together."""
  decode = DecodeConfig.from_config(decode_config)  # a missing field: its default
  sampling = ({'do_sample': True, 'temperature': decode.temperature, 'top_k': decode.top_k}
              if decode.temperature > 0 else {})
  least = {} if eos is None else {'min_new_tokens': decode.min_new_tokens}
  return dict(bos_token_id=0, pad_token_id=0, eos_token_id=eos, suppress_tokens=[0],
              max_length=cfg.max_len, **sampling, **least)


@dataclasses.dataclass(frozen=True)
class Target:
  """One `transformers` model class and how our model becomes it."""
  architecture: str  # the model class (config.architectures[0])
  config_class: str  # its `transformers` config class
  check: Callable  # (ModelConfig) -> None, or raise UnsupportedConfig
  config: Callable  # (ModelConfig, eos_id=) -> the config class's fields
  state_dict: Callable  # (our params, `model.params_of`; ModelConfig) -> {name: float32 array}
  # (ModelConfig, eos id, config.decode) -> GenerationConfig fields; None: no generation head
  generation: Callable | None
  tokenizers: tuple[str, ...]  # the workdir tokenizers (config.data.tokenizer) written for it
  start_token: bool  # the character tokenizer prepends the start token 0 (GPT-2's BOS)


_MARIAN = Target('MarianMTModel', 'MarianConfig', _check_seq2seq, convert.seq2seq_config,
                 convert.seq2seq_state_dict, _beam_generation,
                 ('sentencepiece', 'marian', 'huggingface', 'char'), False)
_PEGASUS = dataclasses.replace(_MARIAN, architecture='PegasusForConditionalGeneration',
                               config_class='PegasusConfig')
_GPT2 = Target('GPT2LMHeadModel', 'GPT2Config', _check_gpt2, convert.gpt2_config,
               convert.gpt2_state_dict, _sampling_generation, ('huggingface', 'char'), True)
_BERT = Target('BertModel', 'BertConfig', _check_bert, convert.bert_config,
               convert.bert_state_dict, None, ('huggingface',), False)
# Keyed through the kind's adapter (model.kinds), never its name:
# (has_source, has_decoder, norm_position).
TARGETS = {(True, True, 'post'): _MARIAN, (True, True, 'pre'): _PEGASUS,
           (False, True, 'pre'): _GPT2, (False, False, 'post'): _BERT}


def target(cfg, tokenizer_name: str | None = None) -> Target:
  """The target of `cfg` (a `ModelConfig`), or `UnsupportedConfig` (one line)."""
  adapter = adapter_of(cfg)
  shape = (adapter.has_source, adapter.has_decoder)
  found = TARGETS.get((*shape, cfg.norm_position))
  if found is None:
    others = {t.architecture: norm for (*key, norm), t in TARGETS.items() if tuple(key) == shape}
    if not others:  # a kind no row serves (every kind of model.kinds has one today)
      _refuse(f'kind={cfg.kind}', 'no transformers class is a target for it')
    _refuse(f'norm_position={cfg.norm_position} ({cfg.kind})', ', '.join(
        f'{arch} is {norm}-LN only' for arch, norm in others.items()))
  found.check(cfg)
  if tokenizer_name is not None and tokenizer_name not in found.tokenizers:
    raise UnsupportedConfig(
        f'config.data.tokenizer={tokenizer_name} with kind={cfg.kind} cannot be exported: the '
        f'exporter writes no {tokenizer_name} tokenizer for {found.architecture} (its '
        f'tokenizers: {", ".join(found.tokenizers)})')
  return found


def check_exportable(cfg, tokenizer_name: str | None = None) -> None:
  """Raises `UnsupportedConfig` (one line) unless a target class expresses `cfg` exactly."""
  target(cfg, tokenizer_name)


def target_class(cfg) -> str:
  """The `transformers` architecture for `cfg` (a `ModelConfig`), or raise."""
  return target(cfg).architecture
