"""Renamed names (issue 28 item 7) keep working for one release, give the same results as the new
names, and warn (a DeprecationWarning naming the new name); the new names do not warn.

  decode `max_len`                  -> `max_new_tokens` (config.decode, searches, Translator,
                                       Session, decode.translate, decode.py's flag)
  `decode=True` / `decode_mask`      -> `use_cache=True` / `cache_mask` (module calls)
  `segmentation=` (inside modules)   -> `segment_ids=` (the batch keys keep their names)
  `kind_of` / `KINDS` / adapter.name -> `adapter_of` / `ADAPTERS` / `adapter.kind`
  `tokenizer.kind`                   -> `tokenizer.name`
  `AddPositions(kind=)`              -> `AddPositions(encoding=)`
  `sample(module, params, prompt, *, inputs)` -> `(module, params, inputs, *, prompt)`
"""

import json
import os
import subprocess
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from absl import flags

from autoregressive import decoding
from model import attention as attn, build_model, layers, shift_right
from model.kinds import adapter_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(vocab_size=16, num_encoder_layers=1, num_decoder_layers=1, d_model=16, num_heads=2,
            d_ff=32, max_len=16, dropout_rate=0.0)
SRC = np.array([[3, 4, 5, 6, 1], [7, 8, 1, 0, 0]], np.int32)
PREFIX = np.array([[9, 0], [10, 11]], np.int32)


def _model(kind='encoder_decoder'):
  module = build_model({**TINY, 'kind': kind})
  params = module.init(jax.random.PRNGKey(0), *adapter_of(module).example_inputs(4))['params']
  return module, params


@pytest.fixture(scope='module')
def mt():
  return _model()


@pytest.fixture(scope='module')
def lm():
  return _model('decoder_only')


def _same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


# ----------------------------------------------------------------------------- decoding

def test_new_names_do_not_warn(mt, lm):
  """Every path under its new names runs without a DeprecationWarning: nothing inside still
  uses an old name."""
  from autoregressive.translator import Translator  # pylint: disable=import-outside-toplevel
  (module, params), key = mt, jax.random.PRNGKey(1)
  with warnings.catch_warnings():
    warnings.simplefilter('error', DeprecationWarning)
    decoding.greedy_decode(module, params, SRC, prompt=PREFIX, max_new_tokens=3)
    decoding.beam_search_decode(module, params, SRC, beam_size=2, alpha=0.6, max_new_tokens=3)
    decoding.sample(module, params, SRC, prompt=PREFIX, rng=key, max_new_tokens=3)
    decoding.sample(lm[0], lm[1], prompt=PREFIX, rng=key, max_new_tokens=3)
    decoding.sample(lm[0], lm[1], PREFIX, rng=key, max_new_tokens=3)  # the model's input
    Translator(module, params, beam_size=2, alpha=0.6, max_new_tokens=3, batch_size=2)(
        [[3, 4, 1], None])


@pytest.mark.parametrize('search', ['greedy', 'beam', 'sample'])
def test_max_len_keyword_of_the_searches(mt, search):
  module, params = mt
  fn, kw = {'greedy': (decoding.greedy_decode, {}),
            'beam': (decoding.beam_search_decode, {'beam_size': 2, 'alpha': 0.6}),
            'sample': (decoding.sample, {'rng': jax.random.PRNGKey(2)})}[search]
  with pytest.warns(DeprecationWarning, match=r'\(max_len=\.\.\.\) is deprecated: use '
                                              r'max_new_tokens='):
    old = fn(module, params, SRC, max_len=4, **kw)
  _same(old, fn(module, params, SRC, max_new_tokens=4, **kw))
  with pytest.raises(TypeError, match='both max_len= and max_new_tokens='):
    fn(module, params, SRC, max_len=4, max_new_tokens=4, **kw)


def test_sample_takes_the_argument_order_of_greedy_and_beam(mt, lm):
  """`sample(module, params, inputs=None, *, prompt=None, ...)` as the other two; the two old
  calls whose meaning that changes still work, and warn."""
  (module, params), key = mt, jax.random.PRNGKey(3)
  new = decoding.sample(module, params, SRC, rng=key, max_new_tokens=4)  # the source
  _same(new, decoding.sample(module, params, inputs=SRC, rng=key, max_new_tokens=4))
  with pytest.warns(DeprecationWarning, match=r"source as sample\(prompt=\.\.\.\)"):
    _same(decoding.sample(module, params, prompt=SRC, rng=key, max_new_tokens=4), new)
  forced = decoding.sample(module, params, SRC, prompt=PREFIX, rng=key, max_new_tokens=4)
  with pytest.warns(DeprecationWarning, match=r'sample\(module, params, source, prompt=prompt\)'):
    _same(decoding.sample(module, params, PREFIX, inputs=SRC, rng=key, max_new_tokens=4), forced)
  lm_module, lm_params = lm  # a decoder-only model's positional input is its prompt
  _same(decoding.sample(lm_module, lm_params, PREFIX, rng=key, max_new_tokens=4),
        decoding.sample(lm_module, lm_params, prompt=PREFIX, rng=key, max_new_tokens=4))


def test_translator_and_session_max_len(mt):
  from autoregressive.translator import Translator  # pylint: disable=import-outside-toplevel
  from inference.session import Session  # pylint: disable=import-outside-toplevel
  module, params = mt
  with pytest.warns(DeprecationWarning, match='use max_new_tokens='):
    old = Translator(module, params, beam_size=1, alpha=0.6, max_len=5, batch_size=2)
  new = Translator(module, params, beam_size=1, alpha=0.6, max_new_tokens=5, batch_size=2)
  with pytest.warns(DeprecationWarning, match='use Translator.max_new_tokens'):
    assert old.max_len == 5
  assert new.max_new_tokens == 5 and old([[3, 4, 1]]) == new([[3, 4, 1]])
  tokenizer = types.SimpleNamespace(eos_id=1)
  config = ml_collections.ConfigDict({'decode': {'max_new_tokens': 7, 'beam_size': 1,
                                                 'alpha': 0.6, 'batch_size': 2}})
  session = Session(types.SimpleNamespace(config=config, module=module, params=params,
                                          tokenizer=tokenizer, step=0, kind='encoder_decoder'))
  with pytest.warns(DeprecationWarning, match=r'use Session.max_new_tokens\(\)'):
    assert session.max_len(6) == session.max_new_tokens(6) == 6
  assert session.max_new_tokens() == 7
  with pytest.warns(DeprecationWarning, match='use max_new_tokens='):
    assert session.translator(max_len=3).max_new_tokens == 3


def test_decode_py_translate_max_len(mt):
  import decode  # pylint: disable=import-outside-toplevel
  module, params = mt
  session = types.SimpleNamespace(module=module, params=params,
                                  tokenizer=types.SimpleNamespace(eos_id=1))
  args = dict(beam_size=1, alpha=0.6, batch_size=2, progress=False)
  with pytest.warns(DeprecationWarning, match='use max_new_tokens='):
    old = decode.translate(session, [[3, 4, 1]], max_len=4, **args)
  assert old == decode.translate(session, [[3, 4, 1]], max_new_tokens=4, **args)


# ----------------------------------------------------------------------------- the model

def test_decode_flag_is_use_cache_and_decode_mask_is_cache_mask(mt, lm):
  module, params = mt
  encoded = module.apply({'params': params}, SRC, method=module.encode)
  adapter = adapter_of(module)

  def step(**flag):
    cache = adapter.init_cache(module, encoded, SRC, 2, 4)
    return module.apply({'params': params, 'cache': cache}, encoded, SRC,
                        np.zeros((2, 1), np.int32), method=module.decode, mutable=['cache'],
                        **flag)

  with pytest.warns(DeprecationWarning, match=r'decode\(decode=\.\.\.\) is deprecated: use '
                                              r'use_cache='):
    old = step(decode=True)
  _same(old, step(use_cache=True))
  lm_module, lm_params = lm
  cache = adapter_of(lm_module).init_cache(lm_module, None, None, 2, 4)
  mask = jnp.array([True, False, False, False])[None, None, None, :]
  run = lambda **kw: lm_module.apply({'params': lm_params, 'cache': cache},  # noqa: E731
                                     np.zeros((2, 1), np.int32), mutable=['cache'], **kw)
  with pytest.warns(DeprecationWarning, match='use cache_mask='):
    old = run(use_cache=True, decode_mask=mask)
  _same(old, run(use_cache=True, cache_mask=mask))


def test_segmentation_keyword_is_segment_ids(lm):
  """Inside the modules segment ids are `segment_ids=`; the batch keys keep their names."""
  module, params = lm
  tokens = np.array([[3, 4, 5, 6, 7, 8]], np.int32)
  ids = np.array([[1, 1, 1, 2, 2, 2]], np.int32)
  new = module.apply({'params': params}, tokens, segment_ids=ids)
  with pytest.warns(DeprecationWarning, match='use segment_ids='):
    _same(module.apply({'params': params}, tokens, segmentation=ids), new)
  with pytest.warns(DeprecationWarning, match='use segment_ids='):
    _same(shift_right(tokens, segmentation=ids), shift_right(tokens, segment_ids=ids))
  batch = {'targets': tokens, 'targets_segmentation': ids, 'targets_position': None}
  _same(adapter_of(module).apply_batch(module, {'params': params}, batch, deterministic=True),
        new)


def test_attention_use_cache_keywords():
  with pytest.warns(DeprecationWarning, match='use use_cache='):
    assert attn.select_implementation('chunked', decode=True) is attn.IMPLEMENTATIONS['reference']
  attention = layers.MultiHeadAttention(num_heads=2)
  x = jnp.ones((1, 3, 8))
  variables = attention.init(jax.random.PRNGKey(0), x, use_cache=True)
  with pytest.warns(DeprecationWarning, match='use use_cache='):
    old = attention.apply(variables, x[:, :1], decode=True, mutable=['cache'])
  _same(old, attention.apply(variables, x[:, :1], use_cache=True, mutable=['cache']))


def test_module_attributes_decode_and_kind(mt):
  """`DecoderLayer(decode=...)` is `use_cache`; `AddPositions(kind=...)` is `encoding` (a
  positional encoding is not a model kind)."""
  from model import transformer  # pylint: disable=import-outside-toplevel
  with pytest.warns(DeprecationWarning, match=r'DecoderLayer\(decode=\.\.\.\) is deprecated: '
                                              'use use_cache='):
    layer = transformer.DecoderLayer(mt[0].config, decode=True)
  assert layer.use_cache and layer.decode is None
  x = jnp.ones((1, 3, 8))
  new = layers.AddPositions('learned', 8)
  variables = new.init(jax.random.PRNGKey(0), x)
  with pytest.warns(DeprecationWarning, match='use encoding='):
    old = layers.AddPositions(kind='learned', max_len=8)
  assert old.encoding == 'learned'
  _same(old.apply(variables, x), new.apply(variables, x))
  with pytest.raises(TypeError, match='needs `encoding` and `max_len`'):
    layers.AddPositions(max_len=8)


# ----------------------------------------------------------------------------- kinds, tokenizers

def test_kind_is_a_name_and_adapters_are_adapters(mt):
  import model  # pylint: disable=import-outside-toplevel
  from model import kinds  # pylint: disable=import-outside-toplevel
  module, _ = mt
  adapter = adapter_of(module)
  assert adapter.kind == module.config.kind == 'encoder_decoder'
  assert kinds.ADAPTERS['encoder_decoder'] is adapter
  with pytest.warns(DeprecationWarning, match='use model.kinds.adapter_of'):
    assert kinds.kind_of(module) is adapter
  with pytest.warns(DeprecationWarning, match='use model.kinds.ADAPTERS'):
    from model.kinds import KINDS  # pylint: disable=import-outside-toplevel
  assert KINDS is kinds.ADAPTERS
  with pytest.warns(DeprecationWarning, match='use model.kinds.ADAPTERS'):
    assert model.KINDS is kinds.ADAPTERS
  with pytest.warns(DeprecationWarning, match='use ModelAdapter.kind'):
    assert adapter.name == 'encoder_decoder'


def test_tokenizer_kind_is_its_name(tmp_path):
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizers.CharTokenizer(list('abc'))
  assert tokenizer.name == 'char'
  with pytest.warns(DeprecationWarning, match='use tokenizer.name'):
    assert tokenizer.kind == 'char'
  tokenizer.save(str(tmp_path / tokenizers.TOKENIZER_DIR))  # the file format keeps 'kind'
  with open(tmp_path / tokenizers.TOKENIZER_DIR / 'tokenizer.json') as f:
    assert json.load(f)['kind'] == 'char'
  assert tokenizers.load_tokenizer(str(tmp_path)).name == 'char'


def test_export_tokenizer_kind_keyword():
  from hf_export import targets  # pylint: disable=import-outside-toplevel
  from model import ModelConfig  # pylint: disable=import-outside-toplevel
  cfg = ModelConfig(**{**TINY, 'kind': 'decoder_only', 'norm_position': 'pre'})
  with pytest.warns(DeprecationWarning, match='use tokenizer_name='):
    targets.check_exportable(cfg, tokenizer_kind='char')
  with pytest.raises(targets.UnsupportedConfig):
    targets.check_exportable(cfg, tokenizer_name='sentencepiece')


# ----------------------------------------------------------------------------- config, flags

def test_config_decode_max_len_is_read_as_max_new_tokens(tmp_path):
  from configs import base  # pylint: disable=import-outside-toplevel
  from training import config_io  # pylint: disable=import-outside-toplevel
  config = base.base_config()
  assert 'max_len' not in config.decode and config.decode.max_new_tokens == 128
  config.decode.max_len = 9  # an old preset
  config.lock()
  with pytest.warns(DeprecationWarning, match='config.decode.max_len is deprecated: use '
                                              'config.decode.max_new_tokens'):
    config_io.upgrade_config(config)
  assert config.decode.max_new_tokens == 9 and 'max_len' not in config.decode
  old = json.loads(json.dumps(base.base_config().to_dict()))  # an old DIR/config.json
  old['decode']['max_len'] = old['decode'].pop('max_new_tokens') - 1
  (tmp_path / 'config.json').write_text(json.dumps(old))
  with pytest.warns(DeprecationWarning, match='use config.decode.max_new_tokens'):
    loaded = config_io.load_config(str(tmp_path))
  assert loaded.decode.max_new_tokens == 127 and 'max_len' not in loaded.decode
  assert config_io.renamed_override('--config.decode.max_len=5') == (
      '--config.decode.max_new_tokens=5')
  assert config_io.renamed_override('--config.model.max_len=5') is None  # positions: kept


def test_train_py_old_override_warns_one_line(capsys):
  import train  # pylint: disable=import-outside-toplevel
  argv = ['train.py', '--config.decode.max_len=5', '--config.model.max_len=64',
          '--config.decode.max_len', '6']
  assert train.renamed_overrides(argv) == [
      'train.py', '--config.decode.max_new_tokens=5', '--config.model.max_len=64',
      '--config.decode.max_new_tokens', '6']
  err = capsys.readouterr().err.splitlines()
  assert err == ['train.py: warning: --config.decode.max_len is deprecated: use '
                 '--config.decode.max_new_tokens (the old name goes in the next release)'] * 2
  config = ml_collections.ConfigDict({'decode': {'max_len': 3}})
  assert train.upgraded(config).decode.max_new_tokens == 3
  assert capsys.readouterr().err.count('train.py: warning: config.decode.max_len') == 1


def test_train_py_reads_an_old_override_as_the_new_field(tmp_path):
  """End to end: `--config.decode.max_len=0` is checked as config.decode.max_new_tokens."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, os.path.join(REPO, 'train.py'),
                           f'--workdir={tmp_path / "run"}', '--config.decode.max_len=0'],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
  lines = result.stderr.splitlines()
  assert result.returncode == 2, result.stderr[-2000:]
  assert ('train.py: warning: --config.decode.max_len is deprecated: use '
          '--config.decode.max_new_tokens (the old name goes in the next release)') in lines
  assert lines[-1].startswith('train.py: error: config.decode.max_new_tokens=0 must be an '
                              'integer in [1, '), lines


def test_decode_py_max_len_flag_warns_one_line(capsys):
  from inference import decode_cli  # pylint: disable=import-outside-toplevel
  from training import cli  # pylint: disable=import-outside-toplevel

  def parsed(*args):
    values = flags.FlagValues()
    for name in ('max_len', 'max_new_tokens'):
      flags.DEFINE_integer(name, None, '', flag_values=values)
    values(['decode.py', *args])
    return values

  values = parsed('--max_len=6')
  decode_cli.rename_flags(values)
  assert values.max_new_tokens == 6 and values['max_new_tokens'].present
  assert capsys.readouterr().err.splitlines() == [
      'decode.py: warning: --max_len is deprecated: use --max_new_tokens (the old name goes in '
      'the next release)']
  values = parsed('--max_new_tokens=6')
  decode_cli.rename_flags(values)
  assert values.max_new_tokens == 6 and capsys.readouterr().err == ''
  with pytest.raises(cli.UsageError, match='--max_len is the old name of --max_new_tokens'):
    decode_cli.rename_flags(parsed('--max_len=6', '--max_new_tokens=6'))
