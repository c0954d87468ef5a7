"""`attention.IMPLEMENTATIONS`: one row per implementation, used by the config and the layer.

The values of each fast path against the reference are tested in test_attention_impls.py; here:
what the rows refuse and hand over, and that a new variant is one row plus its function.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from model import ConfigError, ModelConfig, attention as attn, build_model
from model.build import with_options
from model.config import ATTENTION_IMPLS

TINY = dict(kind='decoder_only', vocab_size=20, num_decoder_layers=1, d_model=16, num_heads=2,
            d_ff=32, max_len=16)


def test_the_config_offers_every_row():
  assert ATTENTION_IMPLS == tuple(attn.IMPLEMENTATIONS)
  with pytest.raises(ConfigError, match=r"attention_impl='nope' is not one of \['reference'"):
    ModelConfig.from_config({**TINY, 'attention_impl': 'nope'})


def test_each_constraint_has_its_message():
  cudnn, chunked = attn.IMPLEMENTATIONS['cudnn'], attn.IMPLEMENTATIONS['chunked']
  subject = 'S'
  assert cudnn.refusal(subject) is None  # no fact given, nothing to refuse
  assert 'bfloat16 or float16 only, got float32' in cudnn.refusal(subject, dtype=jnp.float32)
  assert cudnn.refusal(subject, dtype='bfloat16') is None
  assert 'attention dropout' in cudnn.refusal(subject, dropout_rng_impl='hash')
  assert "use attention_impl='reference' or 'chunked'" in cudnn.refusal(
      subject, dropout_rng_impl='hash')
  assert "dropout_rng_impl='hash'" in chunked.refusal(subject, dropout_rng_impl='threefry')
  assert chunked.refusal(subject, dropout_rng_impl='hash') is None
  assert 'FactoredMask' in cudnn.refusal(subject, mask=jnp.ones((1, 1, 2, 2), bool))
  packed = attn.FactoredMask(query_segment_ids=jnp.ones((1, 2)), key_segment_ids=jnp.ones((1, 2)))
  assert 'packed' in cudnn.refusal(subject, mask=packed)
  assert cudnn.refusal(subject, mask=attn.FactoredMask(causal=True)) is None
  assert 'multiple of 8 and at most 128, got 12' in cudnn.refusal(subject, head_dim=12)
  assert 'gpu only, not cpu' in cudnn.refusal(subject, backend='cpu')
  for row in attn.IMPLEMENTATIONS.values():  # every message starts with its subject
    for facts in ({'dtype': 'float32'}, {'head_dim': 12}, {'dropout_rng_impl': 'threefry'}):
      assert (row.refusal(subject, **facts) or subject).startswith(subject)


def test_calls_a_row_cannot_serve_go_to_another():
  select = attn.select_implementation
  for name in ('chunked', 'cudnn'):  # decoding steps: nothing quadratic to save
    assert select(name, use_cache=True) is attn.IMPLEMENTATIONS['reference']
  xla = attn.IMPLEMENTATIONS['xla']
  assert select('xla', use_cache=True) is xla
  assert select('xla', dropout_rng_impl='hash') is attn.IMPLEMENTATIONS['reference']
  # cuDNN has no fallback for dropout: the row stays, and refuses it.
  assert select('cudnn', dropout_rng_impl='hash') is attn.IMPLEMENTATIONS['cudnn']


def test_a_new_variant_is_one_row(monkeypatch):
  """A row added to the table is accepted by the config and called by the layer."""
  calls = []

  def doubled(query, key, value, *, mask, **kwargs):
    calls.append(query.shape)
    out, _ = attn.IMPLEMENTATIONS['reference'].fn(query, key, value, mask=mask, **kwargs)
    return out * 2, None

  monkeypatch.setitem(attn.IMPLEMENTATIONS, 'doubled',
                      attn.AttentionImpl(doubled, dtypes=('float32',)))
  tokens = jnp.array([[3, 4, 5, 0]])
  module = build_model({**TINY, 'attention_impl': 'doubled'})
  out = module(tokens)
  assert calls  # the layer called the row's function
  assert not np.allclose(out, with_options(module, attention_impl='reference')(tokens))
  with pytest.raises(ConfigError, match="attention_impl='doubled' computes in float32 only"):
    build_model({**TINY, 'attention_impl': 'doubled', 'dtype': 'bfloat16'})
