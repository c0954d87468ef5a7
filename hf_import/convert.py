"""`transformers` state dicts -> our parameters, as pure NumPy functions: the inverse of
`hf_export.convert` (same piece names, same layouts), plus BERT's encoder.

Every function takes the checkpoint's state dict (name -> float32 array; torch Linear weights
are `[out, in]`, GPT-2's Conv1D `[in, out]`), the `ModelConfig` built for it and `vocab`, the
checkpoint's token ids in our id order (`vocab_order`): our row i is the checkpoint's row
`vocab[i]`. The result is `model.params_of`'s unrolled layout (`layers/0`, ...).

Marian's model dimension is in its sinusoid's order (first half sin, second half cos); ours
interleaves them (`hf_export.convert.halves_order`), so every weight that reads or writes the
residual stream is permuted back (`inverse`): the same function, the same position table.
"""

from __future__ import annotations

import numpy as np

from hf_export.convert import halves_order


def vocab_order(vocab_size: int, pad: int, eos: int | None, unk: int | None) -> np.ndarray:
  """`[vocab_size]` checkpoint ids in our order: pad first (our PAD_ID 0, the decoder's start),
  then EOS (EOS_ID 1) and unk (UNK_ID 2) where the checkpoint has them, then the others in
  their order. The identity for a model this project exported (pad 0, EOS 1, unk 2)."""
  first = [pad] + ([eos] if eos is not None else [])
  if eos is not None and unk is not None:
    first.append(unk)
  rest = np.setdiff1d(np.arange(vocab_size), first)
  return np.concatenate([np.asarray(first, np.int64), rest])


def inverse(order: np.ndarray) -> np.ndarray:
  return np.argsort(order)


def _norm(sd, name, inv) -> dict:
  return {'scale': sd[f'{name}.weight'][inv], 'bias': sd[f'{name}.bias'][inv]}


def _reads(weights, heads, inv) -> tuple[np.ndarray, np.ndarray]:
  """Projections reading the stream (torch `[out, in]` weights, `[out]` biases), fused on a
  new axis 1 -> kernel `[d, len(weights), heads, head_dim]` (axis 1 dropped for one), bias."""
  kernels = [w.T[inv] for w, _ in weights]
  d = kernels[0].shape[0]
  kernel = np.stack(kernels, 1).reshape(d, len(weights), heads, -1)
  bias = np.stack([b for _, b in weights]).reshape(len(weights), heads, -1)
  return (kernel[:, 0], bias[0]) if len(weights) == 1 else (kernel, bias)


def _linear(sd, name) -> tuple[np.ndarray, np.ndarray]:
  return sd[f'{name}.weight'], sd[f'{name}.bias']


def _attention_out(sd, name, heads, inv) -> dict:
  """An output projection writing the stream -> `{kernel [heads, head_dim, d], bias [d]}`."""
  weight, bias = _linear(sd, name)
  d = weight.shape[0]
  return {'kernel': weight.T[:, inv].reshape(heads, -1, d), 'bias': bias[inv]}


def _ffn(sd, wi: str, wo: str, inv) -> dict:
  (w1, b1), (w2, b2) = _linear(sd, wi), _linear(sd, wo)
  return {'wi': {'kernel': w1.T[inv], 'bias': b1}, 'wo': {'kernel': w2.T[:, inv], 'bias': b2[inv]}}


def _bart_layer(sd, prefix: str, heads: int, inv, cross: bool) -> dict:
  """One Marian (BART-style) layer `prefix.*` -> our layer."""
  def attention(name):
    return [_linear(sd, f'{prefix}.{name}.{p}_proj') for p in 'qkv']
  kernel, bias = _reads(attention('self_attn'), heads, inv)
  layer = {'self_attention': {'qkv': {'kernel': kernel, 'bias': bias},
                              'out': _attention_out(sd, f'{prefix}.self_attn.out_proj', heads,
                                                    inv)},
           'self_attention_norm': _norm(sd, f'{prefix}.self_attn_layer_norm', inv),
           'ffn': _ffn(sd, f'{prefix}.fc1', f'{prefix}.fc2', inv),
           'ffn_norm': _norm(sd, f'{prefix}.final_layer_norm', inv)}
  if cross:
    q, k, v = attention('encoder_attn')
    query, kv = _reads([q], heads, inv), _reads([k, v], heads, inv)
    layer['cross_attention'] = {
        'query': {'kernel': query[0], 'bias': query[1]},
        'kv': {'kernel': kv[0], 'bias': kv[1]},
        'out': _attention_out(sd, f'{prefix}.encoder_attn.out_proj', heads, inv)}
    layer['cross_attention_norm'] = _norm(sd, f'{prefix}.encoder_attn_layer_norm', inv)
  return layer


def marian_params(sd, cfg, vocab) -> dict:
  """MarianMTModel's state dict -> our encoder-decoder parameters."""
  inv = inverse(halves_order(cfg.d_model))
  shared = sd.get('model.shared.weight', sd.get('model.encoder.embed_tokens.weight'))
  params = {'embed': {'embedding': shared[vocab][:, inv]}}
  if not cfg.share_embeddings:
    params['target_embed'] = {'embedding': sd['model.decoder.embed_tokens.weight'][vocab][:, inv]}
  for side, count in (('encoder', cfg.num_encoder_layers), ('decoder', cfg.num_decoder_layers)):
    params[side] = {'layers': {i: _bart_layer(sd, f'model.{side}.layers.{i}', cfg.num_heads, inv,
                                              cross=side == 'decoder')
                               for i in range(count)}}
  bias = sd['final_logits_bias'].reshape(-1)[vocab].copy()
  bias[0] = 0.0  # pad (our 0) is never generated nor normalised over; an export writes -1e9
  if cfg.logits_via_embedding:
    if cfg.final_logits_bias:
      params['decoder']['logits_bias'] = bias
  else:
    params['decoder']['logits'] = {'kernel': sd['lm_head.weight'][vocab][:, inv].T, 'bias': bias}
  return params


def gpt2_params(sd, cfg, vocab) -> dict:
  """GPT2LMHeadModel's state dict (`transformer.*`) -> our decoder-only parameters. Conv1D
  weights are `[in, out]` already; c_attn's `[d, 3d]` is our fused `[d, 3, heads, head_dim]`."""
  d, heads = cfg.d_model, cfg.num_heads
  layers = {}
  for i in range(cfg.num_decoder_layers):
    h = f'transformer.h.{i}'
    layers[i] = {
        'self_attention': {
            'qkv': {'kernel': sd[f'{h}.attn.c_attn.weight'].reshape(d, 3, heads, -1),
                    'bias': sd[f'{h}.attn.c_attn.bias'].reshape(3, heads, -1)},
            'out': {'kernel': sd[f'{h}.attn.c_proj.weight'].reshape(heads, -1, d),
                    'bias': sd[f'{h}.attn.c_proj.bias']}},
        'self_attention_norm': _norm(sd, f'{h}.ln_1', slice(None)),
        'ffn': {'wi': {'kernel': sd[f'{h}.mlp.c_fc.weight'], 'bias': sd[f'{h}.mlp.c_fc.bias']},
                'wo': {'kernel': sd[f'{h}.mlp.c_proj.weight'], 'bias': sd[f'{h}.mlp.c_proj.bias']}},
        'ffn_norm': _norm(sd, f'{h}.ln_2', slice(None))}
  return {'embed': {'embedding': sd['transformer.wte.weight'][vocab]},
          'decoder': {'layers': layers,
                      'positions': {'pos_embedding': sd['transformer.wpe.weight'][:cfg.max_len]},
                      'final_norm': _norm(sd, 'transformer.ln_f', slice(None))}}


def bert_params(sd, cfg, vocab) -> dict:
  """BertModel's state dict -> our encoder-only parameters (the pooler is not carried).
  Token type 0's embedding is added to every position's: the model reads one segment."""
  heads, keep = cfg.num_heads, slice(None)
  layers = {}
  for i in range(cfg.num_encoder_layers):
    p = f'encoder.layer.{i}'
    kernel, bias = _reads([_linear(sd, f'{p}.attention.self.{x}') for x in
                           ('query', 'key', 'value')], heads, keep)
    layers[i] = {
        'self_attention': {'qkv': {'kernel': kernel, 'bias': bias},
                           'out': _attention_out(sd, f'{p}.attention.output.dense', heads, keep)},
        'self_attention_norm': _norm(sd, f'{p}.attention.output.LayerNorm', keep),
        'ffn': _ffn(sd, f'{p}.intermediate.dense', f'{p}.output.dense', keep),
        'ffn_norm': _norm(sd, f'{p}.output.LayerNorm', keep)}
  positions = (sd['embeddings.position_embeddings.weight'][:cfg.max_len]
               + sd['embeddings.token_type_embeddings.weight'][0])
  return {'embed': {'embedding': sd['embeddings.word_embeddings.weight'][vocab]},
          'encoder': {'layers': layers, 'positions': {'pos_embedding': positions},
                      'embedding_norm': _norm(sd, 'embeddings.LayerNorm', keep)}}
