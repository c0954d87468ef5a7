"""`config.model.init`, `config.model.scale_embeddings` and the weight-decay mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import optim
from common import scores
from configs import shakespeare_char
from model import build_model, params_of
from model.build import with_options
from model.config import ConfigError, ModelConfig

LAYERS = 3


def _config(**changes):
  fields = {'kind': 'decoder_only', 'vocab_size': 300, 'num_encoder_layers': 0,
            'num_decoder_layers': LAYERS, 'd_model': 256, 'num_heads': 4, 'd_ff': 1024,
            'max_len': 16, 'positional_encoding': 'learned', 'norm_position': 'pre',
            'dropout_rate': 0.0}
  fields.update(changes)
  return ModelConfig(**fields)


def _params(config, seed=0):
  module = build_model(config, rngs=nnx.Rngs(seed))
  return module, params_of(module)


def _flat(params):
  return {'/'.join(str(k.key) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_leaves_with_path(params)}


def test_gpt2_init_stds_zero_biases_and_scaled_residual_projections():
  flat = _flat(_params(_config(init='gpt2'))[1])
  residual = 0.02 / np.sqrt(2 * LAYERS)
  for name, value in flat.items():
    if name.endswith('bias'):
      assert not value.any(), name
    elif name.endswith('scale'):  # LayerNorm
      assert np.all(value == 1.0), name
    else:
      want = residual if name.endswith(('out/kernel', 'wo/kernel')) else 0.02
      assert value.std() == pytest.approx(want, rel=0.1), name
      assert abs(value.mean()) < want / 5, name
  assert 'decoder/layers/0/self_attention/out/kernel' in flat
  assert 'decoder/layers/2/ffn/wo/kernel' in flat and 'embed/embedding' in flat


# Elements 0, 1, 1000 and -1 of some of the paper init's tensors at seed 0 (jax 0.10.2, flax
# 0.12.8, 2026-11-27): the init is the default and unchanged, not merely equal to itself.
PAPER_INIT_REFERENCE = {
    'decoder/layers/0/self_attention/qkv/kernel': [0.061612244695425034, 0.06311919540166855,
                                                   0.05332804098725319, -0.012124705128371716],
    'embed/embedding': [0.06275089085102081, -0.05664607509970665, 0.03899304196238518,
                        -0.025581764057278633],
    'decoder/layers/1/ffn/wi/kernel': [-0.04460228234529495, -0.06455519795417786,
                                       -0.04963434860110283, -0.04737445339560509],
}


def test_paper_init_is_the_default_and_unchanged():
  flat = _flat(_params(_config())[1])
  for name, values in PAPER_INIT_REFERENCE.items():
    np.testing.assert_allclose(flat[name].reshape(-1)[[0, 1, 1000, -1]], values, rtol=1e-6,
                               err_msg=name)
  qkv = flat['decoder/layers/0/self_attention/qkv/kernel']  # Glorot uniform over [256, 768]
  assert np.abs(qkv).max() <= np.sqrt(6 / (256 + 768))
  assert flat['embed/embedding'].std() == pytest.approx(256 ** -0.5, rel=0.1)


def test_scale_embeddings_multiplies_by_sqrt_d_model():
  module = build_model(_config())
  unscaled = with_options(module, scale_embeddings=False)
  tokens = jnp.array([[3, 4, 5]])
  np.testing.assert_allclose(module.embed(tokens), 16.0 * unscaled.embed(tokens), rtol=1e-6)


@pytest.mark.parametrize('field,value', [('init', 'xavier'), ('scale_embeddings', 'yes')])
def test_bad_values_name_the_field(field, value):
  with pytest.raises(ConfigError, match=rf'config\.model\.{field}='):
    _config(**{field: value}).validate()


def test_old_config_without_the_new_fields_loads_with_defaults():
  old = {k: v for k, v in shakespeare_char.get_config().model.items()
         if k not in ('init', 'scale_embeddings')}
  config = ModelConfig.from_config(old)
  assert config.init == 'paper' and config.scale_embeddings is True


@pytest.mark.parametrize('scan', [False, True])
def test_weight_decay_mask_matrices_skips_biases_and_norms(scan):
  params = _params(_config(scan_layers=scan))[1]
  ndim = _flat(optim.WEIGHT_DECAY_MASKS['ndim'](params))
  matrices = _flat(optim.WEIGHT_DECAY_MASKS['matrices'](params))
  for name, decayed in matrices.items():
    assert bool(decayed) == name.endswith(('kernel', 'embedding')), name
  # 'ndim' (the default) decays the fused [3, heads, head_dim] Q/K/V bias: 'matrices' does not.
  qkv_bias = ('decoder/layers' if scan else 'decoder/layers/0') + '/self_attention/qkv/bias'
  assert ndim[qkv_bias] and not matrices[qkv_bias]


def test_weight_decay_mask_default_and_bad_value():
  config = shakespeare_char.get_config('tiny')
  del config.optimizer['weight_decay_mask']  # a config saved before the field: 'ndim'
  optim.make_optimizer(config)
  config.optimizer.weight_decay_mask = 'all'
  with pytest.raises(ValueError, match=r'config\.optimizer\.weight_decay_mask='):
    optim.make_optimizer(config)


def test_lowercase_bleu_line():
  lines = scores.report_lines(['A man rides a bike .'], ['a man rides a bike.'],
                             lowercase_bleu=True)
  assert lines[0].startswith('BLEU = ') and 'case:mixed' in lines[0]
  assert lines[1].startswith('BLEU (lowercased, tokenized) = 100.00') and 'case:lc' in lines[1]
  assert len(scores.report_lines(['a'], ['a'])) == 2  # BLEU and chrF only without the flag
