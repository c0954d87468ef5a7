"""Text-file datasets (`parallel_text`) and the input pipeline's one-line errors for bad input."""

import gzip

import pytest

import input_pipeline as ip
from input_pipeline import sources, textfiles
from tests.input_pipeline.test_input_pipeline import BATCH, _mt_config


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('tfds')


# ----------------------------------------------------------------------------- parallel_text


def _write(path, lines, gz=False):
  data = ''.join(line + '\n' for line in lines).encode()
  if gz:
    with gzip.open(path, 'wb') as f:
      f.write(data)
  else:
    path.write_bytes(data)
  return str(path)


def test_parallel_text(tmp_path, caplog):
  en = [f'sentence number {i} is here' for i in range(300)]
  de = [f'Satz Nummer {i} ist hier' for i in range(300)]
  en[5] = ''  # an empty line: the pair is skipped with a warning
  src = _write(tmp_path / 'train.en.gz', en, gz=True)
  tgt = _write(tmp_path / 'train.de', de)
  vsrc, vtgt = _write(tmp_path / 'v.en', en[:40]), _write(tmp_path / 'v.de', de[:40])
  config = _mt_config(tmp_path / 'tfds', dataset='parallel_text', train_files=f'{src},{tgt}',
                      eval_files=f'{vsrc},{vtgt}', vocab_size=300)
  with caplog.at_level('WARNING'):
    ds = ip.get_datasets(config, workdir=str(tmp_path / 'wd'), process_index=0, process_count=1)
  assert 'Skipped 1 of 300' in caplog.text
  assert len(sources.get_source(config.data, 'train')) == 299
  examples = ds.eval_examples()
  assert len(examples) == 39 and examples[0] == {'source': en[0], 'target': de[0]}
  assert next(ds.train_iter)['inputs'].shape == (BATCH, 64)
  # Other files get their own prepared directory (keyed by a hash of the contents).
  other = _write(tmp_path / 'other.de', [s.upper() for s in de])
  config2 = _mt_config(tmp_path / 'tfds', dataset='parallel_text', train_files=f'{src},{other}')
  first = sources.get_builder(config.data).directory('train')
  second = sources.get_builder(config2.data).directory('train')
  assert first != second
  assert sources.as_str(sources.get_source(config2.data, 'train')[0]['target']) == de[0].upper()


# ----------------------------------------------------------------------------- bad input


def _error(config, exc=ip.DataError):
  with pytest.raises(exc) as info:
    ip.get_datasets(config, workdir=None, process_index=0, process_count=1)
  message = str(info.value)
  assert '\n' not in message
  return message


def test_bad_input_messages(tmp_path, data_dir):
  good = _write(tmp_path / 'good.en', ['a b c', 'd e f'])
  short = _write(tmp_path / 'short.de', ['x y z'])
  empty = _write(tmp_path / 'empty.de', [])
  missing = str(tmp_path / 'missing.de')
  dd = tmp_path / 'tfds'

  def pt(files, **kw):
    return _mt_config(dd, dataset='parallel_text', train_files=files, **kw)

  msg = _error(pt(f'{good},{missing}'), FileNotFoundError)
  assert missing in msg
  msg = _error(pt(f'{good},{tmp_path}'))
  assert msg == f'data file {tmp_path} is not a regular file', msg
  msg = _error(pt(f'{good},{short}'))
  assert 'line counts' in msg and good in msg and short in msg
  msg = _error(pt(f'{good},{empty}'))
  assert 'empty' in msg and empty in msg
  msg = _error(pt(good))
  assert 'config.data.train_files' in msg
  msg = _error(pt(f'{good},{good}', vocab_size=8000))
  assert 'config.data.vocab_size=8000 is too large' in msg
  msg = _error(pt(f'{good},{good}', vocab_size=100))
  assert 'config.data.vocab_size=100 is too small' in msg
  a_file = _write(tmp_path / 'a_file', ['kept'])
  for where in (a_file, f'{a_file}/below'):  # train.py's traceback from os.makedirs, before
    msg = _error(_mt_config(where))
    assert msg == (f'data_dir {where} (config.data.data_dir): {a_file} exists and is not a '
                   'directory')
    msg = _error(_mt_config(where, dataset='parallel_text', train_files=f'{good},{good}'))
    assert msg.endswith(f'{a_file} exists and is not a directory')
  assert open(a_file).read() == 'kept\n'
  with pytest.raises(ip.DataFileError, match=f'cannot create {a_file}/below: Not a directory'):
    with textfiles.file_lock(f'{a_file}/below/x.lock'):
      pass
  msg = _error(_mt_config(data_dir, dataset='no_such_dataset'))
  assert 'no_such_dataset' in msg and 'config.data.dataset' in msg
  msg = _error(_mt_config(data_dir, dataset='wmt14_translate/de-en'))
  assert 'wmt14_translate/de-en' in msg and 'tfds build' in msg
  with pytest.raises(ip.DataError, match="no split 'nope'"):
    ip.get_datasets(_mt_config(data_dir, eval_split='nope'), workdir=None, process_index=0,
                    process_count=1).num_eval_batches()
  with pytest.raises(ip.DataError, match='not divisible'):
    ip.get_datasets(_mt_config(data_dir), workdir=None, process_index=0, process_count=3)
  with pytest.raises(ip.DataFileError, match='no tokenizer'):
    ip.load_tokenizer(str(tmp_path / 'nowhere'))
