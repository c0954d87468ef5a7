"""The schema of every config section (configs/schema.py, model.ModelConfig): defaults, docs,
one-line refusals, 'did you mean', configs/base.py built from them, and --show_config's origins
(its command line is in tests/commands/test_train_cli.py)."""

import dataclasses

import pytest

from common.errors import ConfigError
from common.schema import DOC, default_of
from configs import base, resolve, schema, show
from tests.training import test_train_synthetic as syn
from training import config_check


@pytest.mark.parametrize('section,values,message', [
    ('data', {'max_length': 1}, 'config.data.max_length=1 must be an integer >= 2'),
    ('data', {'tokenizer': 'bytes'},
     "config.data.tokenizer='bytes' is not one of ['sentencepiece', 'char', 'marian', "
     "'huggingface']"),
    ('data', {'packing': 'yes'}, "config.data.packing='yes' must be True or False"),
    ('data', {'num_workers': -1}, 'config.data.num_workers=-1 must be an integer >= 0'),
    # Files named for another dataset were ignored: the run trained on the bundled corpus.
    ('data', {'train_files': 'a.en,a.de'},
     'config.data.train_files applies only to dataset=parallel_text or text_files '
     "(dataset='multi30k' reads no files)"),
    ('data', {'subword_sampling_alpha': 1.0},
     'config.data.subword_sampling_alpha=1.0 must be in [0, 1)'),
    ('optimizer', {'name': 'sgd'},
     "config.optimizer.name='sgd' is not one of ['adam', 'adamw', 'muon']"),
    ('optimizer', {'b1': 1.0}, 'config.optimizer.b1=1.0 must be in [0, 1) (also as a float32'),
    ('optimizer', {'schedule': 'rsqrt', 'warmup_steps': 0},
     'config.optimizer.warmup_steps must be > 0 for schedule=rsqrt'),
    ('train', {'log_every_steps': 0}, 'config.train.log_every_steps=0 must be a positive integer'),
    ('train', {'profile_steps': '9,3'},
     "config.train.profile_steps: '9,3' needs 1 <= START <= END"),
    ('train', {'dry_run': 1}, 'config.train.dry_run=1 must be True or False'),
    ('decode', {'top_k': -1}, 'config.decode.top_k=-1 must be an integer in [0, 2147483647]'),
    ('decode', {'max_new_tokens': 8, 'min_new_tokens': 9},
     'config.decode.min_new_tokens=9 is more than config.decode.max_new_tokens=8'),
    ('decode', {'alpha': float('nan')}, 'config.decode.alpha=nan must be a number in [0, 10]'),
    ('mesh', {'fsdp': 0}, 'config.mesh.fsdp=0 must be a positive integer or -1'),
    ('mesh', {'data': -1, 'tensor': -1},
     'config.mesh: only one of data/fsdp/tensor may be -1, got [-1, 1, -1]'),
    ('mesh', {'rules': {'hidden': 'tensor'}}, 'config.mesh.rules.hidden: unknown logical axis'),
])
def test_each_section_refuses_a_bad_value_in_one_line(section, values, message):
  with pytest.raises(ConfigError) as e:
    schema.SECTIONS[section].from_config(values)
  assert str(e.value).startswith(message) and '\n' not in str(e.value), str(e.value)


@pytest.mark.parametrize('section', list(schema.SECTIONS))
def test_every_field_has_a_doc_and_the_defaults_pass(section):
  cls = schema.SECTIONS[section]
  for field in dataclasses.fields(cls):
    doc = field.metadata.get(DOC, '')
    assert doc and '\n' not in doc, f'config.{section}.{field.name} has no one-line doc'
  cls.from_config({})  # every default is valid


def test_base_config_is_the_schemas_defaults():
  config = base.base_config()
  assert sorted(config.keys()) == sorted(schema.SECTIONS)
  for name, cls in schema.SECTIONS.items():
    assert config[name].to_dict() == cls.defaults(), name
    for field in dataclasses.fields(cls):  # None: a typed placeholder, overridable by a flag
      if default_of(field) is None:
        assert config[name].get_ref(field.name).get_type() in (str, int), field.name


def test_unknown_fields_and_sections_get_did_you_mean():
  with pytest.raises(ConfigError, match=r"^config.data has unknown field\(s\) \['max_lenght'\]; "
                                        r'did you mean config.data.max_length\?$'):
    schema.DataConfig.from_config({'max_lenght': 3})
  with pytest.raises(ConfigError, match=r"unknown field\(s\) \['zzz'\]; known: \['data', "):
    schema.MeshConfig.from_config({'zzz': 1})
  config = syn.tiny_config()
  config.train.num_step = 3  # a preset's typo: a new field, not the one it meant
  with pytest.raises(ConfigError, match=r'did you mean config.train.num_steps\?$'):
    config_check.validate_config(config)
  config = syn.tiny_config()
  config.trian = {'num_steps': 3}
  with pytest.raises(ConfigError, match=r"unknown section\(s\) \['trian'\]; did you mean "
                                        r'config.train\?$'):
    config_check.validate_config(config)


def test_the_resolver_takes_a_file_or_values_and_refuses_in_one_line(tmp_path):
  """configs.resolve: a preset file and config.json's values (a field they lack at its
  default) give the same config; the preset is not changed; a typo gets the one 'did you
  mean', a value of the wrong type and a bad value one line each."""
  preset = resolve.load('configs/default.py:tiny')
  config, origins = resolve.resolve(preset, {'train.num_steps': 7})
  assert (config.train.num_steps, preset.train.num_steps, origins['train.num_steps']) == (
      7, 20, 'override')
  values = config.to_dict()
  del values['train']['z_loss']  # a run from before the field
  again, _ = resolve.resolve(values, validate=False)
  assert again.to_dict() == config.to_dict()
  with pytest.raises(resolve.UnknownField, match=r"^unknown config field 'model.num_headz'; "
                                                 r'did you mean config.model.num_heads\?$'):
    resolve.resolve(preset, {'model.num_headz': 2})
  with pytest.raises(ConfigError, match=r"^config.train.num_steps='ten': "):
    resolve.resolve(preset, {'train.num_steps': 'ten'})
  with pytest.raises(ConfigError, match=r'^config.train.num_steps=-1 must be a positive'):
    resolve.resolve(preset, {'train.num_steps': -1})
  resolve.resolve(preset, {'train.num_steps': -1}, validate=False)  # the trainer checks it
  assert resolve.parse_command_line('configs/default.py:tiny', [
      '--config.train.num_steps=7', '--config.optimizer.learning_rate=2']) == {
          'train.num_steps': 7, 'optimizer.learning_rate': 2.0}
  (tmp_path / 'broken.py').write_text('def get_config():\n  return None\n')
  with pytest.raises(ConfigError, match='not a ConfigDict'):
    resolve.load(str(tmp_path / 'broken.py'))


def test_origins_of_a_preset_field_an_override_and_a_default():
  config, origins = resolve.resolve('configs/default.py:tiny',
                                    {'train.num_steps': 9, 'mesh.rules.vocab': ''})
  found = {r[0]: r for lines in show.rows(config, origins) for r in lines}
  assert found['train.num_steps'][1:3] == ('9', 'override')
  assert found['mesh.rules.vocab'][1:3] == ("''", 'override')
  assert found['train.batch_size'][1:3] == ('16', 'preset')  # the schema's is 256
  assert found['train.seed'][1:3] == ('0', 'default')
  assert found['mesh.rules.embed'][1:3] == ("'fsdp'", 'default')
  assert found['model.dropout_rate'][2] == 'default'  # the preset sets the default's 0.1
  assert found['optimizer.name'][3].endswith('[adam | adamw | muon]')
  fields = sum(len(dataclasses.fields(cls)) for cls in schema.SECTIONS.values())
  assert len(found) == fields - 1 + len(config.mesh.rules)  # a row per rule, not one for all


@pytest.mark.parametrize('module', ['multi30k', 'shakespeare_char'])
def test_a_preset_of_overrides_differs_from_its_base_in_those_fields_only(module):
  """`configs/NAME.py:PRESET` for each PRESET of its OVERRIDES (the presets a sweep row can
  restate, so that a sweep's runs and a preset's are one config) is the base config with
  exactly those fields changed."""
  import importlib  # pylint: disable=import-outside-toplevel
  configs = importlib.import_module(f'configs.{module}')
  base = configs.get_config().to_dict()
  for preset, overrides in configs.OVERRIDES.items():
    got = configs.get_config(preset).to_dict()
    changed = {f'{s}.{f}' for s in base for f in base[s] if base[s][f] != got[s][f]}
    assert changed == {k for k, v in overrides.items() if base[k.split('.')[0]][k.split('.')[1]]
                       != v}, preset
    assert all(got[k.split('.')[0]][k.split('.')[1]] == v for k, v in overrides.items()), preset
