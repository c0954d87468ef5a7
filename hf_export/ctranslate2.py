"""CTranslate2 export: our parameters written straight into a CTranslate2 model spec.

  encoder_decoder -> `ctranslate2.specs.TransformerSpec`            (`ctranslate2.Translator`)
  decoder_only    -> `ctranslate2.specs.TransformerDecoderModelSpec` (`ctranslate2.Generator`)

The converters CTranslate2 ships cannot take the transformers export: Marian's convention
puts `<pad>` last and starts the decoder from a zero vector, where ours has pad = 0 and
starts from token 0's learned embedding. The spec here says what our model computes:
- vocabulary: our ids as they are (id 0 = `<pad>` = the decoder start token, then EOS, ...),
  padded with `<extra_id_N>` up to config.model.vocab_size, plus `<unk>` when the tokenizer
  has none (CTranslate2 appends one to any vocabulary that lacks it; it gets a zero row);
- the position table given explicitly (sinusoidal in our interleaved layout, or the learned
  table; none with rope: rotary on all dimensions, halves not interleaved, base 10000), so
  no reordering of the model dimension is needed. A Translator's sinusoid has
  `convert.position_count` = max(max_len, 1024) rows: CTranslate2's default limits (1024
  source, 256 target positions) run any line. A learned table, and a Generator's sinusoid,
  have max_len rows: a position past them fails with CTranslate2's own message ("No
  position encodings are defined for positions >= N") unless export_info.json's options
  are passed;
- embeddings times sqrt(d_model) (or not: config.model.scale_embeddings), pre/post LayerNorm,
  the final LayerNorm of a pre-LN stack, the model's LayerNorm epsilon, its activation;
- shared embeddings / tied output as the config says (with `final_logits_bias`, the output
  bias is the model's); the output bias is -1e9 at `<pad>`
  (and at an added `<unk>`), so they are never generated, and CTranslate2 normalises over the
  vocabulary without them: the distribution our searches and scores use
  (`autoregressive.strategies.loop.log_normalizer`), so both engines rank hypotheses alike.

Decoding (export_info.json lists the options): sources are the tokenizer's pieces without
EOS (the model config adds it, and `max_input_length=max_len` cuts as decode.py does,
keeping EOS last); `max_decoding_length` counts the EOS like our `max_new_tokens`,
`min_decoding_length` is our `min_new_tokens` (EOS is masked before it, in both: CTranslate2
renormalises the masked step, ours keeps the model's probabilities, a constant shift of the
first step's scores at the default of 1); beam search with `length_penalty=0` is decode.py's
`--alpha=0` (CTranslate2's penalty is len ** lp, not GNMT's ((5 + len) / 6) ** alpha), and
then both stop a sentence once its best candidate ends: the same search. With a length penalty
CTranslate2 stops at beam_size finished hypotheses, ours once no alive one can overtake the
best (`autoregressive.strategies.beam`).
"""

from __future__ import annotations

import os

import numpy as np

from configs.schema import DecodeConfig
from hf_export import convert, targets
from model import attention as attn
from model.kinds import adapter_of

UNK = '<unk>'


def check(cfg, tokenizer_name=None) -> None:
  """Raises `UnsupportedConfig` (one line) for a model CTranslate2 cannot run."""
  del tokenizer_name  # both tokenizers are plain vocabularies here
  if not adapter_of(cfg).has_decoder:
    raise targets.UnsupportedConfig(
        f'config.model.kind={cfg.kind} cannot be exported to CTranslate2: it has no '
        'generation head (Translator and Generator need a decoder)')
  targets.check_layers(cfg, 'CTranslate2')
  if cfg.embedding_norm:
    raise targets.UnsupportedConfig(
        'config.model.embedding_norm=True cannot be exported to CTranslate2: the exporter '
        'writes no LayerNorm on the embeddings')


def vocabulary(tokenizer, vocab_size: int) -> list[str]:
  """Our tokens by id, padded to `vocab_size`, with `<unk>` appended when missing."""
  tokens = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  tokens += [f'<extra_id_{i}>' for i in range(vocab_size - len(tokens))]
  if len(set(tokens)) != len(tokens):
    raise ValueError('the vocabulary has repeated tokens; CTranslate2 maps tokens by name')
  return tokens if UNK in tokens else tokens + [UNK]


# ----------------------------------------------------------------------------- weights

def _np(x) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32))


def _rows(table, n: int) -> np.ndarray:
  """`[vocab, d]` -> `[n, d]`, zero rows appended (the added `<unk>`)."""
  table = _np(table)
  return np.concatenate([table, np.zeros((n - len(table), table.shape[1]), np.float32)])


def _linear(spec, dense) -> None:
  """Our Dense `kernel [d_in, *out]` -> CTranslate2's `weight [out, d_in]` (torch layout)."""
  kernel, bias = np.asarray(dense['kernel']), dense['bias']
  spec.weight = _np(kernel.reshape(kernel.shape[0], -1).T)
  spec.bias = _np(np.asarray(bias).reshape(-1))


def _out_linear(spec, dense) -> None:
  """An output projection `kernel [heads, head_dim, d]` -> weight `[d, heads * head_dim]`."""
  kernel = np.asarray(dense['kernel'])
  spec.weight = _np(kernel.reshape(-1, kernel.shape[-1]).T)
  spec.bias = _np(dense['bias'])


def _norm(spec, norm) -> None:
  """A LayerNorm's `{scale, bias}`."""
  spec.gamma, spec.beta = _np(norm['scale']), _np(norm['bias'])


def _attention(spec, attention, norm, cross: bool) -> None:
  _norm(spec.layer_norm, norm)
  if cross:  # linear[0] = query, linear[1] = the fused key/value
    _linear(spec.linear[0], attention['query'])
    _linear(spec.linear[1], attention['kv'])
  else:  # linear[0] = the fused query/key/value, [3 * d, d]: q, k, v, each heads-major
    _linear(spec.linear[0], attention['qkv'])
  _out_linear(spec.linear[-1], attention['out'])


def _layer(spec, layer) -> None:
  _attention(spec.self_attention, layer['self_attention'], layer['self_attention_norm'],
             cross=False)
  if 'cross_attention' in layer:
    _attention(spec.attention, layer['cross_attention'], layer['cross_attention_norm'],
               cross=True)
  _norm(spec.ffn.layer_norm, layer['ffn_norm'])
  _linear(spec.ffn.linear_0, layer['ffn']['wi'])
  _linear(spec.ffn.linear_1, layer['ffn']['wo'])


def _stack(spec, stack, embedding, cfg) -> None:
  """Embedding, positions, layers and final norm of one side (`encoder` / `decoder`)."""
  if isinstance(spec.embeddings, list):
    spec.embeddings[0].weight = embedding
  else:
    spec.embeddings.weight = embedding
  spec.scale_embeddings = bool(cfg.scale_embeddings)
  if cfg.positional_encoding == 'sinusoidal':
    spec.position_encodings.encodings = _np(attn.sinusoidal_positions(convert.position_count(cfg),
                                                                      cfg.d_model))
  elif cfg.positional_encoding == 'learned':
    spec.position_encodings.encodings = _np(stack['positions']['pos_embedding'])
  for layer_spec, layer in zip(spec.layer, convert.layers_of(stack), strict=True):
    _layer(layer_spec, layer)
  if cfg.norm_position == 'pre':
    _norm(spec.layer_norm, stack['final_norm'])


def _projection(spec, params, embedding, cfg, never: list[int]) -> None:
  """The output layer: the (target) embedding when tied, else our `logits` Dense; `never`
  ids get a -1e9 bias."""
  n = len(embedding)
  if cfg.logits_via_embedding:
    spec.weight, bias = embedding, np.zeros(n, np.float32)
    if cfg.final_logits_bias:
      bias[:cfg.vocab_size] = _np(params['decoder']['logits_bias'])
  else:
    dense = params['decoder']['logits']
    spec.weight = _rows(np.asarray(dense['kernel']).T, n)
    bias = np.concatenate([_np(dense['bias']), np.zeros(n - cfg.vocab_size, np.float32)])
  bias[never] = convert.NEVER
  spec.bias = bias


# ----------------------------------------------------------------------------- spec

def _layer_kwargs(cfg) -> dict:
  from ctranslate2.specs import common_spec  # pylint: disable=import-outside-toplevel

  activation = {'relu': common_spec.Activation.RELU, 'gelu': common_spec.Activation.GELUTanh,
                'gelu_exact': common_spec.Activation.GELU,
                'silu': common_spec.Activation.SWISH}[cfg.activation]
  kwargs = {'pre_norm': cfg.norm_position == 'pre', 'activation': activation}
  if cfg.positional_encoding == 'rope':  # model.attention.rotary_embedding: rotate halves
    kwargs.update(rotary_dim=0, rotary_interleave=False, rotary_base=10000.0)
  return kwargs


def model_spec(params, cfg, tokenizer):
  """Our `params` (`model.params_of`) of `cfg` (a ModelConfig) and `tokenizer` -> a validated
  spec."""
  from ctranslate2.specs import transformer_spec as ts  # pylint: disable=import-outside-toplevel

  check(cfg)
  tokens = vocabulary(tokenizer, cfg.vocab_size)
  n = len(tokens)
  never = [0] + ([n - 1] if n > cfg.vocab_size else [])  # <pad>, and an added <unk>
  kwargs = _layer_kwargs(cfg)
  source = _rows(params['embed']['embedding'], n)
  target = source if cfg.share_embeddings or 'target_embed' not in params else _rows(
      params['target_embed']['embedding'], n)
  if adapter_of(cfg).has_source:
    spec = ts.TransformerSpec(ts.TransformerEncoderSpec(cfg.num_encoder_layers, cfg.num_heads,
                                                        **kwargs),
                              ts.TransformerDecoderSpec(cfg.num_decoder_layers, cfg.num_heads,
                                                        **kwargs))
    _stack(spec.encoder, params['encoder'], source, cfg)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.decoder_start_token = tokens[0]
    spec.config.add_source_eos = tokenizer.eos_id is not None
  else:
    spec = ts.TransformerDecoderModelSpec(ts.TransformerDecoderSpec(
        cfg.num_decoder_layers, cfg.num_heads, with_encoder_attention=False, **kwargs))
    spec.register_vocabulary(tokens)
  _stack(spec.decoder, params['decoder'], target, cfg)
  _projection(spec.decoder.projection, params, target, cfg, never)
  eos = tokens[tokenizer.eos_id] if tokenizer.eos_id is not None else '</s>'  # '</s>': none
  spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = tokens[0], eos, UNK
  spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
  spec.validate()
  return spec


def _beyond(cfg) -> str:
  """What a Translator does past max_len with CTranslate2's default options instead."""
  positions = convert.position_count(cfg)
  if cfg.positional_encoding == 'learned':
    return (f'Without them a source or translation past {positions} tokens fails: the '
            f'learned table has {positions} rows.')
  exported = ('rotary positions' if cfg.positional_encoding == 'rope' else
              f'{positions} sinusoidal positions are exported')
  return ('Without them a longer line is translated whole, up to CTranslate2\'s defaults '
          f'(1024 source, 256 target tokens; {exported}).')


def decoding_options(cfg, tokenizer, decode_config) -> dict:
  """The options that make CTranslate2 decode as decode.py does (for export_info.json)."""
  decode = DecodeConfig.from_config(decode_config)  # a missing field: its default
  max_new_tokens = min(decode.max_new_tokens, cfg.max_len)
  min_new_tokens = min(decode.min_new_tokens, max_new_tokens)
  if adapter_of(cfg).has_source:
    return {'class': 'ctranslate2.Translator', 'input': 'the tokenizer\'s pieces, no EOS',
            'translate_batch': {'beam_size': decode.beam_size,
                                'length_penalty': 0.0, 'max_decoding_length': max_new_tokens,
                                'min_decoding_length': min_new_tokens,
                                'max_input_length': cfg.max_len},
            'note': 'length_penalty=0 is decode.py --alpha=0 (the GNMT penalty has no '
                    'CTranslate2 equivalent); max_input_length and max_decoding_length cut '
                    f'at max_len as decode.py does. {_beyond(cfg)}'}
  return {'class': 'ctranslate2.Generator',
          'input': f'[{tokenizer.id_to_piece(0)!r}] + the prompt\'s tokens (the start token)',
          'generate_batch': {'sampling_topk': 1, 'include_prompt_in_result': False,
                             **({'end_token': []} if tokenizer.eos_id is None else {})},
          'note': f'max_length at most {cfg.max_len} - the prompt\'s length: the start token, '
                  f'the prompt and the new tokens fit in {cfg.max_len} positions. decode.py '
                  'continues past that in windows; CTranslate2 stops with an error naming the '
                  'limit'}


class FORMAT:  # noqa: N801  # the format object `hf_export.writer` dispatches to
  """The ctranslate2 format for `hf_export.writer.export_workdir`."""
  name = 'ctranslate2'
  check = staticmethod(check)

  @staticmethod
  def prepare(model_config, tokenizer, config):
    del model_config, tokenizer, config
    import ctranslate2.specs  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import

  @staticmethod
  def write(directory, restored, model_config, tokenizer, config, metadata):
    del model_config, metadata  # the restored (unrolled) model's config is the one to write
    cfg, params = convert.restored_params(restored)
    spec = model_spec(params, cfg, tokenizer)
    spec.optimize(quantization=None)
    spec.save(directory)
    if tokenizer.name == 'sentencepiece':  # what makes the pieces: users need it to tokenize
      with open(os.path.join(directory, 'spm.model'), 'wb') as f:
        f.write(tokenizer.model_proto)
    what = 'Translator' if adapter_of(cfg).has_source else 'Generator'
    return f'a CTranslate2 {what} model', {
        'ctranslate2': decoding_options(cfg, tokenizer, config.decode),
        'tokenizer': tokenizer.name, 'max_len': cfg.max_len,
        'positions': convert.position_count(cfg) if cfg.positional_encoding != 'rope' else None}
