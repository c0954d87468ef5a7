"""Our parameters -> `transformers` state dicts and configs, as pure NumPy functions.

Targets (the table is `hf_export.targets.TARGETS`):
  encoder_decoder, norm_position='post'  MarianMTModel    (post-LN, scaled sinusoidal embeddings)
  encoder_decoder, norm_position='pre'   PegasusForConditionalGeneration (the same, pre-LN, with a
                                         final LayerNorm after each stack, as ours)
  decoder_only,    norm_position='pre'   GPT2LMHeadModel  (pre-LN, absolute positions, tied softmax)
  encoder_only,    norm_position='post'  BertModel        (post-LN, learned positions, LayerNormed
                                         embeddings; one token type, all zeros; a zero pooler)

Exactness:
- Marian/Pegasus build their sinusoid as `[sin(all frequencies) | cos(all frequencies)]`;
  ours interleaves `sin, cos` per frequency (the paper). Both are the same columns in another
  order, so the model dimension is permuted by `halves_order(d)` in every weight that reads or
  writes the residual stream (embeddings, LayerNorms, projections). LayerNorm and dot products
  do not care about the order of the dimension, so the permuted model computes the same
  function, and its position table is exactly Marian's.
- GPT-2 does not scale its embeddings by sqrt(d_model): `wte` holds ours times sqrt(d_model),
  and the final LayerNorm's scale and offset are divided by it, so the tied logits are ours
  (with `scale_embeddings=False` both are ours as they are).
- Positions: `position_count` rows. A sinusoidal encoder-decoder gets more than max_len (the
  sinusoid is defined everywhere), so a line past max_len runs instead of failing; its first
  max_len rows are the model's own, so shorter lines give the same logits.
- LayerNorm epsilon: ours is config.model.layer_norm_epsilon (1e-6 by default). GPT-2's is a
  config field; Marian and Pegasus hard-code torch's 1e-5. With another epsilon that is the
  one difference this conversion cannot remove: each LayerNorm output changes by a factor
  sqrt((var + eps) / (var + 1e-5)), about 1 - (1e-5 - eps) / (2 var) (docs/guide.md's export); an
  imported Marian model has 1e-5 and exports exactly.
- BERT: every weight as it is (no reordering, no scale). Our position table already holds
  the token type 0 embedding an import added to it (`hf_import.convert.bert_params`), so the
  export has one token type whose embedding is zeros: BERT adds it to every position, and an
  import of the export adds zeros back, the same table bit for bit.

A params tree here is `model.params_of(model)`: nested dicts of arrays (`layers/0`, ... or the
scan_layers layout; `layers_of` reads either).
"""

from __future__ import annotations

import jax
import numpy as np

from common.tokens import PAD_ID
from model import attention as attn
from model.kinds import adapter_of

# ModelConfig.activation -> transformers' activation_function (flax's gelu is the tanh form,
# transformers' 'gelu_new'; transformers' 'gelu' is the erf form).
HF_ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu_new', 'gelu_exact': 'gelu', 'silu': 'swish'}
NEVER = -1e9  # output bias of tokens that are never generated (exp underflows to exactly 0)
# CTranslate2's default max_input_length; its max_decoding_length (256) is within it and
# neither engine offsets positions, so a sinusoidal translation model runs any line the
# engines take with their defaults.
ENGINE_POSITIONS = 1024


def position_count(cfg) -> int:
  """Rows of the position table the exports define for `cfg` (a ModelConfig).

  max(max_len, ENGINE_POSITIONS) for a sinusoidal encoder-decoder. A learned table has only
  max_len rows; so has a language model's sinusoid: decode.py continues past max_len in
  windows of max_len positions, never at farther ones, and the exports stop there instead.
  Rotary positions (CTranslate2 only) need no table.
  """
  if cfg.positional_encoding == 'sinusoidal' and adapter_of(cfg).has_source:
    return max(cfg.max_len, ENGINE_POSITIONS)
  return cfg.max_len


def halves_order(d_model: int) -> np.ndarray:
  """`[d_model]` indices: the even (sin) dimensions, then the odd (cos) ones.

  `ours[..., halves_order(d)]` is in Marian's layout: `sinusoidal_positions(L, d)[:, order]`
  equals Marian's table (first half sin, second half cos, same frequencies).
  """
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


# ----------------------------------------------------------------------------- one layer

def _norm(norm, order):
  """A LayerNorm's `{scale, bias}` -> (scale, offset) `[d_model]` in the target's order."""
  return np.asarray(norm['scale'])[order], np.asarray(norm['bias'])[order]


def _reader(dense, order, parts=None):
  """A Dense reading the stream: kernel `[d, *out]` -> `[d, out]` rows in the target order.

  With `parts` (fused Q/K/V or K/V kernels `[d, parts, heads, head_dim]`) -> a list of
  `(kernel [d, heads*head_dim], bias [heads*head_dim])`, one per part.
  """
  kernel, bias = np.asarray(dense['kernel']), np.asarray(dense['bias'])
  d = kernel.shape[0]
  if parts is None:
    return kernel.reshape(d, -1)[order], bias.reshape(-1)
  kernel = kernel.reshape(d, parts, -1)[order]
  bias = bias.reshape(parts, -1)
  return [(kernel[:, p], bias[p]) for p in range(parts)]


def _writer(dense, order):
  """A Dense writing the stream: kernel `[*in, d]` -> `[in, d]` columns in the target order."""
  kernel, bias = np.asarray(dense['kernel']), np.asarray(dense['bias'])
  d = kernel.shape[-1]
  return kernel.reshape(-1, d)[:, order], bias[order]


def layer_pieces(layer, order) -> dict:
  """One encoder/decoder layer of ours -> named `(kernel [in, out], bias [out])` and
  `(scale, offset)` pieces, the model dimension in `order`."""
  pieces = {}
  sa = layer['self_attention']
  pieces['q'], pieces['k'], pieces['v'] = _reader(sa['qkv'], order, parts=3)
  pieces['out'] = _writer(sa['out'], order)
  pieces['fc1'] = _reader(layer['ffn']['wi'], order)
  pieces['fc2'] = _writer(layer['ffn']['wo'], order)
  pieces['ffn_norm'] = _norm(layer['ffn_norm'], order)
  pieces['self_norm'] = _norm(layer['self_attention_norm'], order)
  if 'cross_attention' in layer:
    ca = layer['cross_attention']
    pieces['cross_q'] = _reader(ca['query'], order)
    pieces['cross_k'], pieces['cross_v'] = _reader(ca['kv'], order, parts=2)
    pieces['cross_out'] = _writer(ca['out'], order)
    pieces['cross_norm'] = _norm(layer['cross_attention_norm'], order)
  return pieces


def layers_of(stack) -> list[dict]:
  """A stack's (`encoder`, `decoder`) layers in order: `layers/0`, `layers/1`, ... (int keys,
  or their strings as a checkpoint may hold them), or the `scan_layers` layout (every leaf
  `[num_layers, ...]`) sliced per layer."""
  layers = stack['layers']
  if isinstance(layers, (list, tuple)):
    return list(layers)
  if all(str(k).isdigit() for k in layers):
    return [layers[k] for k in sorted(layers, key=int)]
  count = len(jax.tree.leaves(layers)[0])
  return [jax.tree.map(lambda x, i=i: np.asarray(x)[i], layers) for i in range(count)]


# ----------------------------------------------------------------------------- Marian / Pegasus

_BART_LAYER = {'q': 'self_attn.q_proj', 'k': 'self_attn.k_proj', 'v': 'self_attn.v_proj',
               'out': 'self_attn.out_proj', 'self_norm': 'self_attn_layer_norm',
               'cross_q': 'encoder_attn.q_proj', 'cross_k': 'encoder_attn.k_proj',
               'cross_v': 'encoder_attn.v_proj', 'cross_out': 'encoder_attn.out_proj',
               'cross_norm': 'encoder_attn_layer_norm', 'fc1': 'fc1', 'fc2': 'fc2',
               'ffn_norm': 'final_layer_norm'}


def _bart_layer(prefix, pieces) -> dict:
  """Pieces -> `{prefix.name.weight|bias}`; torch Linear weights are `[out, in]`."""
  out = {}
  for piece, (a, b) in pieces.items():
    name = f'{prefix}.{_BART_LAYER[piece]}'
    out[f'{name}.weight'] = a if piece.endswith('norm') else a.T
    out[f'{name}.bias'] = b
  return out


def seq2seq_state_dict(params, cfg) -> dict[str, np.ndarray]:
  """Our encoder-decoder params -> the state dict of MarianMTModel (post-LN) or
  PegasusForConditionalGeneration (pre-LN), float32, the model dimension in Marian's order."""
  order = halves_order(cfg.d_model)
  embed = np.asarray(params['embed']['embedding'])[:, order]  # [vocab, d_model]
  sd = {}
  target = (embed if cfg.share_embeddings else
            np.asarray(params['target_embed']['embedding'])[:, order])
  if cfg.share_embeddings:
    sd['model.shared.weight'] = embed
  if not (cfg.share_embeddings and cfg.logits_via_embedding):
    # transformers ties the encoder/decoder embeddings to `shared` only together with the
    # output layer (tie_word_embeddings); otherwise each is a parameter of its own.
    sd['model.encoder.embed_tokens.weight'] = embed
    sd['model.decoder.embed_tokens.weight'] = target
  for side in ('encoder', 'decoder'):
    for i, layer in enumerate(layers_of(params[side])):
      sd.update(_bart_layer(f'model.{side}.layers.{i}', layer_pieces(layer, order)))
    if cfg.norm_position == 'pre':
      scale, offset = _norm(params[side]['final_norm'], order)
      sd[f'model.{side}.layer_norm.weight'], sd[f'model.{side}.layer_norm.bias'] = scale, offset
      # Pegasus saves its position table; ours, in its order, is the same sinusoid.
      sd[f'model.{side}.embed_positions.weight'] = (
          np.asarray(attn.sinusoidal_positions(position_count(cfg), cfg.d_model))[:, order])
  vocab = cfg.vocab_size
  if cfg.logits_via_embedding:
    sd['final_logits_bias'] = (np.array(params['decoder']['logits_bias']).reshape(1, vocab)
                               if cfg.final_logits_bias else np.zeros((1, vocab), np.float32))
  else:
    kernel, bias = _reader(params['decoder']['logits'], order)  # [d_model, vocab], [vocab]
    sd['lm_head.weight'] = kernel.T
    sd['final_logits_bias'] = bias.reshape(1, vocab).copy()
  # Pad is never output: transformers' log-softmax then runs over the other tokens, the
  # distribution our searches and scores use (autoregressive.strategies.loop.log_normalizer).
  sd['final_logits_bias'][0, PAD_ID] = NEVER
  return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def seq2seq_config(cfg, *, eos_id: int | None) -> dict:
  """MarianConfig / PegasusConfig fields for `cfg` (pad = decoder start = 0, as ours)."""
  fields = {
      'vocab_size': cfg.vocab_size, 'd_model': cfg.d_model,
      'max_position_embeddings': position_count(cfg),  # Marian computes its table from it
      'encoder_layers': cfg.num_encoder_layers, 'decoder_layers': cfg.num_decoder_layers,
      'encoder_attention_heads': cfg.num_heads, 'decoder_attention_heads': cfg.num_heads,
      'encoder_ffn_dim': cfg.d_ff, 'decoder_ffn_dim': cfg.d_ff,
      'activation_function': HF_ACTIVATIONS[cfg.activation],
      'dropout': cfg.dropout_rate, 'attention_dropout': cfg.attention_dropout_rate,
      'activation_dropout': cfg.activation_dropout_rate,
      'scale_embedding': cfg.scale_embeddings, 'pad_token_id': 0,
      'decoder_start_token_id': 0, 'eos_token_id': eos_id, 'forced_eos_token_id': None,
      'bos_token_id': None, 'tie_word_embeddings': cfg.logits_via_embedding}
  if cfg.norm_position == 'post':
    fields.update(decoder_vocab_size=cfg.vocab_size,
                  share_encoder_decoder_embeddings=cfg.share_embeddings)
  return fields


# ----------------------------------------------------------------------------- GPT-2

def gpt2_state_dict(params, cfg) -> dict[str, np.ndarray]:
  """Our decoder-only params -> the state dict of GPT2LMHeadModel (float32).

  Conv1D weights are `[in, out]` like our kernels; c_attn is `[d, 3d]` = `[q | k | v]`,
  which is our fused `[d, 3, heads, head_dim]` kernel flattened.
  """
  d = cfg.d_model
  order = np.arange(d)  # GPT-2's positions are a table we fill in: no reordering needed
  root = np.sqrt(float(d)) if cfg.scale_embeddings else 1.0  # GPT-2 never scales
  sd = {'transformer.wte.weight': np.asarray(params['embed']['embedding']) * root}
  if cfg.positional_encoding == 'learned':
    sd['transformer.wpe.weight'] = np.asarray(params['decoder']['positions']['pos_embedding'])
  else:  # sinusoidal: GPT-2's learned table holds the fixed one
    sd['transformer.wpe.weight'] = np.asarray(attn.sinusoidal_positions(position_count(cfg), d))
  for i, layer in enumerate(layers_of(params['decoder'])):
    p = layer_pieces(layer, order)
    h = f'transformer.h.{i}'
    sd[f'{h}.ln_1.weight'], sd[f'{h}.ln_1.bias'] = p['self_norm']
    sd[f'{h}.attn.c_attn.weight'] = np.concatenate([p[x][0] for x in 'qkv'], axis=1)
    sd[f'{h}.attn.c_attn.bias'] = np.concatenate([p[x][1] for x in 'qkv'])
    sd[f'{h}.attn.c_proj.weight'], sd[f'{h}.attn.c_proj.bias'] = p['out']
    sd[f'{h}.ln_2.weight'], sd[f'{h}.ln_2.bias'] = p['ffn_norm']
    sd[f'{h}.mlp.c_fc.weight'], sd[f'{h}.mlp.c_fc.bias'] = p['fc1']
    sd[f'{h}.mlp.c_proj.weight'], sd[f'{h}.mlp.c_proj.bias'] = p['fc2']
  scale, offset = _norm(params['decoder']['final_norm'], order)
  # wte is sqrt(d) times ours, so the final LayerNorm output is divided by it: same logits.
  sd['transformer.ln_f.weight'], sd['transformer.ln_f.bias'] = scale / root, offset / root
  return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def gpt2_config(cfg, *, eos_id: int | None) -> dict:
  """GPT2Config fields for `cfg`. The start token 0 (our pad) is GPT-2's BOS."""
  return {
      'vocab_size': cfg.vocab_size, 'n_positions': position_count(cfg), 'n_embd': cfg.d_model,
      'n_layer': cfg.num_decoder_layers, 'n_head': cfg.num_heads, 'n_inner': cfg.d_ff,
      'activation_function': HF_ACTIVATIONS[cfg.activation],
      'resid_pdrop': cfg.dropout_rate, 'embd_pdrop': cfg.dropout_rate,
      'attn_pdrop': cfg.attention_dropout_rate, 'layer_norm_epsilon': cfg.layer_norm_epsilon,
      'scale_attn_weights': True, 'scale_attn_by_inverse_layer_idx': False,
      'reorder_and_upcast_attn': False, 'bos_token_id': 0, 'pad_token_id': 0,
      'eos_token_id': eos_id, 'tie_word_embeddings': True}


# ----------------------------------------------------------------------------- BERT

_BERT_LAYER = {'q': 'attention.self.query', 'k': 'attention.self.key',
               'v': 'attention.self.value', 'out': 'attention.output.dense',
               'self_norm': 'attention.output.LayerNorm', 'fc1': 'intermediate.dense',
               'fc2': 'output.dense', 'ffn_norm': 'output.LayerNorm'}


def bert_state_dict(params, cfg) -> dict[str, np.ndarray]:
  """Our encoder-only params -> the state dict of BertModel (float32; torch Linear weights
  `[out, in]`). The pooler is zeros: it is not part of our model (see `hf_export.targets`)."""
  d = cfg.d_model
  order = np.arange(d)  # BERT's positions are a table we fill in: no reordering needed
  encoder = params['encoder']
  sd = {'embeddings.word_embeddings.weight': np.asarray(params['embed']['embedding']),
        'embeddings.position_embeddings.weight': np.asarray(encoder['positions']['pos_embedding']),
        'embeddings.token_type_embeddings.weight': np.zeros((1, d), np.float32)}
  scale, offset = _norm(encoder['embedding_norm'], order)
  sd['embeddings.LayerNorm.weight'], sd['embeddings.LayerNorm.bias'] = scale, offset
  for i, layer in enumerate(layers_of(encoder)):
    for piece, (a, b) in layer_pieces(layer, order).items():
      name = f'encoder.layer.{i}.{_BERT_LAYER[piece]}'
      sd[f'{name}.weight'] = a if piece.endswith('norm') else a.T
      sd[f'{name}.bias'] = b
  sd['pooler.dense.weight'], sd['pooler.dense.bias'] = np.zeros((d, d)), np.zeros(d)
  return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def bert_config(cfg, *, eos_id: int | None) -> dict:
  """BertConfig fields for `cfg`: one token type, absolute positions, pad 0 (as ours)."""
  del eos_id  # an encoder has no EOS of its own (the tokenizer's [SEP] is a token)
  return {
      'vocab_size': cfg.vocab_size, 'hidden_size': cfg.d_model,
      'num_hidden_layers': cfg.num_encoder_layers, 'num_attention_heads': cfg.num_heads,
      'intermediate_size': cfg.d_ff, 'hidden_act': HF_ACTIVATIONS[cfg.activation],
      'max_position_embeddings': cfg.max_len, 'type_vocab_size': 1,
      'layer_norm_eps': cfg.layer_norm_epsilon, 'hidden_dropout_prob': cfg.dropout_rate,
      'attention_probs_dropout_prob': cfg.attention_dropout_rate, 'pad_token_id': 0,
      'position_embedding_type': 'absolute'}


def restored_params(restored):
  """(ModelConfig, params) of an `workdir.restore.Restored`: the restored (unrolled) model's
  config and its parameters (`model.params_of`'s pure dict), on the host."""
  return restored.module.config, jax.device_get(restored.params)
