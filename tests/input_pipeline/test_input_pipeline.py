"""Tests of input_pipeline/: builders, tokenizers, packing, batching, sharding, state."""

import collections
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import input_pipeline as ip
from common import tokens
from configs import default, shakespeare_char
from input_pipeline import packing, pipeline, sources, textfiles
from tests import REPO

VOCAB = 2000
BATCH = 64


def _mt_config(data_dir, **data):
  config = default.get_config()
  config.data.data_dir = str(data_dir)
  config.data.vocab_size = VOCAB
  config.model.vocab_size = VOCAB
  config.train.batch_size = BATCH
  config.data.packing_window = 512
  for k, v in data.items():
    setattr(config.data, k, v)
  return config


def _lm_config(data_dir):
  config = shakespeare_char.get_config()
  config.data.data_dir = str(data_dir)
  config.train.batch_size = 8
  config.data.max_length = 64
  return config


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('tfds')


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('workdir'))


@pytest.fixture(scope='module')
def mt(data_dir, workdir):
  """Multi30k datasets of a single process (prepares and trains the tokenizer once)."""
  return ip.get_datasets(_mt_config(data_dir), workdir=workdir, process_index=0, process_count=1)


def _shakespeare():
  with open(os.path.join(REPO, 'data', 'tinyshakespeare', 'input.txt')) as f:
    return f.read()


def _lines(name):
  return [t.strip() for _, t in textfiles.iter_lines(os.path.join(REPO, 'data', 'multi30k', name))]


@pytest.fixture(scope='module')
def train_pairs(mt):
  """Encoded (inputs, targets) tuples of every training pair, with the pipeline's truncation."""
  def encode(text):  # the text's own encoding, cut as the pipeline cuts it
    return tuple(tokens.truncate(mt.tokenizer.encode(text), mt.config.data.max_length,
                                 mt.tokenizer.eos_id))
  pairs = zip(_lines('train.en.gz'), _lines('train.de.gz'), strict=True)
  return [(encode(s), encode(t)) for s, t in pairs]


def _unpack_batch(batch):
  """(inputs, targets) tuples of every example of a packed batch; checks the layout."""
  out = []
  for r in range(batch['inputs'].shape[0]):
    row = {k: v[r] for k, v in batch.items()}
    for f in ('inputs', 'targets'):
      seg, pos, tok = row[f'{f}_segmentation'], row[f'{f}_position'], row[f]
      np.testing.assert_array_equal(tok > 0, seg > 0)  # pad exactly where segment 0
      used = seg[seg > 0]
      assert np.all(np.diff(used) >= 0)  # each segment contiguous, in order
      np.testing.assert_array_equal(np.unique(used), np.arange(1, len(np.unique(used)) + 1))
      assert np.all(seg[len(used):] == 0)  # padding only at the end
      for s in np.unique(used):
        np.testing.assert_array_equal(pos[seg == s], np.arange((seg == s).sum()))
    segments = [set(np.unique(row[f'{f}_segmentation'])) - {0} for f in ('inputs', 'targets')]
    assert segments[0] == segments[1]
    for i, t in zip(packing.unpack(row, 'inputs'), packing.unpack(row, 'targets'), strict=True):
      out.append((tuple(i), tuple(t)))
  return out


# ----------------------------------------------------------------------------- builders


def test_multi30k_builder_counts(mt):
  counts = {s: len(sources.get_source(mt.config.data, s)) for s in ('train', 'validation', 'test')}
  assert counts == {'train': 29_000, 'validation': 1_014, 'test': 1_000}
  examples = mt.eval_examples('test')
  assert examples[0] == {'source': _lines('test_2016_flickr.en.gz')[0],
                         'target': _lines('test_2016_flickr.de.gz')[0]}
  assert [e['target'] for e in mt.eval_examples()] == _lines('val.de.gz')
  assert 'tensorflow' not in sys.modules


def test_shakespeare_builder_split(data_dir):
  config = _lm_config(data_dir)
  text = _shakespeare()
  train = sources.get_source(config.data, 'train')
  val = sources.get_source(config.data, 'validation')
  train_text, val_text = sources.as_str(train[0]['text']), sources.as_str(val[0]['text'])
  assert (len(train_text), len(val_text)) == (1_003_854, 111_540)
  assert train_text + val_text == text


def test_catalog_dataset_path(mt, monkeypatch):
  """A dataset prepared in data_dir but not one of ours loads by name (read-only builder)."""
  monkeypatch.delitem(sources.LOCAL_BUILDERS, 'multi30k')
  monkeypatch.setattr(sources, '_BUILDERS', {})
  builder = sources.get_builder(mt.config.data)
  assert type(builder).__name__ == 'ReadOnlyBuilder'
  assert sources.text_keys(mt.config.data) == ('en', 'de')
  test = sources.get_source(mt.config.data, 'test')
  assert len(test) == 1000
  assert sources.as_str(test[0]['en']) == _lines('test_2016_flickr.en.gz')[0]


def test_concurrent_prepare_without_tensorflow(tmp_path):
  """Two processes prepare one data dir at once, and neither imports tensorflow."""
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {REPO!r})
      from configs import default
      from input_pipeline import sources
      config = default.get_config()
      config.data.data_dir = {str(tmp_path)!r}
      print(len(sources.get_source(config.data, 'train')))
      assert 'tensorflow' not in sys.modules
  """)
  procs = [subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
  for p in procs:
    out, err = p.communicate()
    assert p.returncode == 0, err[-2000:]
    assert out.strip().splitlines()[-1] == '29000'


# ----------------------------------------------------------------------------- tokenizers


def test_tokenizer_roundtrip_validation(mt, workdir):
  tok = mt.tokenizer
  assert (tok.pad_id, tok.eos_id, tok.vocab_size) == (0, 1, VOCAB)
  sentences = _lines('val.en.gz') + _lines('val.de.gz')
  assert any('\u00a0' in s for s in sentences)
  for s in sentences:
    ids = tok.encode(s)
    assert ids[-1] == 1 and 0 not in ids and 1 not in ids[:-1]
    assert tok.decode(ids) == s
  tab_line = next(s for s in _lines('train.de.gz') if '\t' in s)
  for s in (tab_line, 'a\u00a0b\tc  d', 'Überraschung: 日本語!'):
    assert tok.decode(tok.encode(s)) == s
  ids = tok.encode('Ein Hund.')
  assert tok.decode(ids + [0, 0] + tok.encode('rest')) == 'Ein Hund.'
  assert tok.decode(np.array([0] + ids)) == 'Ein Hund.'
  assert isinstance(tok.id_to_piece(ids[0]), str)
  # Saved into the workdir, reloaded with nothing but the workdir, reused by get_tokenizer.
  loaded = ip.load_tokenizer(workdir)
  assert loaded.encode(sentences[0]) == tok.encode(sentences[0])
  assert ip.get_tokenizer(mt.config.data, workdir).model_proto == tok.model_proto


def test_tokenizer_training_is_deterministic(mt):
  again = ip.get_tokenizer(mt.config.data, None)
  assert again.model_proto == mt.tokenizer.model_proto


def test_tokenizer_mismatch_with_workdir(mt, workdir):
  config = _mt_config(mt.config.data.data_dir, vocab_size=1000)
  with pytest.raises(ip.DataError, match='vocab_size'):
    ip.get_tokenizer(config.data, workdir)


def test_char_tokenizer(data_dir, tmp_path):
  tok = ip.get_tokenizer(_lm_config(data_dir).data, str(tmp_path))
  assert tok.vocab_size == 66 and tok.pad_id == 0 and tok.eos_id is None
  assert tok.id_to_piece(1) == '\n' and tok.id_to_piece(65) == 'z'
  assert tok.decode(tok.encode('To be, or not to be?\n')) == 'To be, or not to be?\n'
  assert ip.load_tokenizer(str(tmp_path)).chars == tok.chars


# ----------------------------------------------------------------------------- packing


def test_pack_window_keeps_every_token(mt, train_pairs):
  rng = np.random.default_rng(0)
  chosen = [train_pairs[i] for i in rng.permutation(len(train_pairs))[:1000]]
  examples = [{'inputs': np.array(i, np.int32), 'targets': np.array(t, np.int32)}
              for i, t in chosen]
  rows = packing.pack_window(examples, ('inputs', 'targets'), 64, rng)
  assert rows['inputs'].shape[0] < len(examples) / 2  # several examples per row
  assert ((rows['inputs'] > 0).mean() + (rows['targets'] > 0).mean()) / 2 > 0.9
  assert collections.Counter(_unpack_batch(rows)) == collections.Counter(chosen)


def test_packed_train_batches(mt, train_pairs):
  known = set(train_pairs)
  nonpad = total = 0
  for _ in range(12):
    batch = next(mt.train_iter)
    assert set(batch) == {'inputs', 'targets', 'inputs_segmentation', 'inputs_position',
                          'targets_segmentation', 'targets_position'}
    for v in batch.values():
      assert v.shape == (BATCH, 64) and v.dtype == np.int32
    examples = _unpack_batch(batch)
    assert all(e in known for e in examples)  # segments never mix examples
    nonpad += (batch['inputs'] > 0).sum() + (batch['targets'] > 0).sum()
    total += 2 * batch['inputs'].size
  assert nonpad / total > 0.9


def test_unpacked_train_batches(mt, workdir, train_pairs):
  config = _mt_config(mt.config.data.data_dir, packing=False)
  ds = ip.get_datasets(config, workdir=workdir, process_index=0, process_count=1)
  batch = next(ds.train_iter)
  assert set(batch) == {'inputs', 'targets'} and batch['inputs'].shape == (BATCH, 64)
  known = set(train_pairs)
  for i, t in zip(batch['inputs'], batch['targets'], strict=True):
    assert (tuple(i[i > 0]), tuple(t[t > 0])) in known


def test_truncation_keeps_eos(mt):
  flat, lengths = packing.ragged_from_lists(
      [mt.tokenizer.encode('word ' * 50), mt.tokenizer.encode('kurz')], 8, mt.tokenizer.eos_id)
  assert list(lengths[:1]) == [8] and flat[7] == 1
  assert flat[-1] == 1 and lengths[1] < 8
  # The cached ids, cut on reading: `tokens.truncate` of each example, EOS kept last.
  ids = mt._ids('train')
  read = pipeline.CachedIds(ids, 8, mt.tokenizer.eos_id)
  indices = np.arange(0, 3000, 7)
  got = read(0, indices)
  for feature, key in zip(pipeline.FEATURES, ids.keys, strict=True):
    flat, lengths = got[feature]
    rows = np.split(flat, np.cumsum(lengths)[:-1])
    assert [r.tolist() for r in rows] == [
        tokens.truncate(ids.arrays[key][i].tolist(), 8, 1) for i in indices]


# ----------------------------------------------------------------------------- eval + sharding


def _eval_rows(ds, split=None):
  batches = list(ds.eval_batches(split))
  assert len(batches) == ds.num_eval_batches(split)
  rows = []
  for b in batches:
    assert b['inputs'].shape == (ds.batch_size, 64)
    for i, t in zip(b['inputs'], b['targets'], strict=True):
      if i.any():
        rows.append((tuple(i[i > 0]), tuple(t[t > 0])))
      else:
        assert not t.any()  # padding rows are all zero
  return rows, batches


def test_eval_batches_cover_each_example_once(mt):
  rows, batches = _eval_rows(mt)
  assert len(batches) == -(-1014 // BATCH)
  def encode(text):
    return tuple(tokens.truncate(mt.tokenizer.encode(text), 64, mt.tokenizer.eos_id))
  expected = [(encode(s), encode(t))
              for s, t in zip(_lines('val.en.gz'), _lines('val.de.gz'), strict=True)]
  assert collections.Counter(rows) == collections.Counter(expected)
  assert not batches[-1]['inputs'][1014 % BATCH:].any()


def test_two_processes_read_disjoint_shards(mt, workdir, train_pairs):
  shards = [ip.get_datasets(mt.config, workdir=workdir, process_index=p, process_count=2)
            for p in (0, 1)]
  assert all(ds.batch_size == BATCH // 2 for ds in shards)
  rows = [_eval_rows(ds)[0] for ds in shards]
  assert len(rows[0]) + len(rows[1]) == 1014
  assert shards[0].num_eval_batches() == shards[1].num_eval_batches()
  full, _ = _eval_rows(mt)
  assert collections.Counter(rows[0]) + collections.Counter(rows[1]) == collections.Counter(full)
  # Training: each process only sees examples of its own shard of the train split.
  for p, ds in enumerate(shards):
    own = set(train_pairs[p::2])
    batch = next(ds.train_iter)
    assert batch['inputs'].shape == (BATCH // 2, 64)
    assert all(e in own for e in _unpack_batch(batch))
  test_rows = [_eval_rows(ds, 'test')[0] for ds in shards]
  assert len(test_rows[0]) == len(test_rows[1]) == 500


# ----------------------------------------------------------------------------- iterator state


def _check_state_roundtrip(make, skip):
  it = make().train_iter
  for _ in range(skip):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it) for _ in range(4)]
  restored = make().train_iter
  restored.set_state(state)
  for want in expected:
    got = next(restored)
    assert set(got) == set(want)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize('packed,skip', [(True, 3), (True, 0), (False, 5)])
def test_iterator_state_roundtrip(mt, workdir, packed, skip):
  config = _mt_config(mt.config.data.data_dir, packing=packed)
  _check_state_roundtrip(
      lambda: ip.get_datasets(config, workdir=workdir, process_index=0, process_count=1), skip)


def test_lm_iterator_state_roundtrip(data_dir, tmp_path):
  config = _lm_config(data_dir)
  _check_state_roundtrip(lambda: ip.get_datasets(config, workdir=str(tmp_path), process_index=0,
                                                 process_count=1), 7)


# ----------------------------------------------------------------------------- language model


def test_lm_blocks(data_dir, tmp_path):
  config = _lm_config(data_dir)
  ds = ip.get_datasets(config, workdir=str(tmp_path), process_index=0, process_count=1)
  text = _shakespeare()
  train_text, val_text = text[:1_003_854], text[1_003_854:]
  batch = next(ds.train_iter)
  assert batch['targets'].shape == (8, 65) and batch['targets'].dtype == np.int32
  assert batch['targets_weights'].dtype == np.float32
  weights = batch['targets_weights']
  assert np.all(weights[:, 0] == 0) and np.all(weights[:, 1:] == 1)
  for row in batch['targets']:
    assert ds.tokenizer.decode(row) in train_text
  # Eval blocks: stride 64, overlapping by one token; every val char but the first predicted once.
  blocks = pipeline.lm_eval_blocks(np.array(ds.tokenizer.encode(val_text), np.int32), 64)
  assert blocks['targets_weights'].sum() == len(val_text) - 1
  batches = list(ds.eval_batches())
  assert len(batches) == ds.num_eval_batches() == -(-len(blocks['targets']) // 8)
  rebuilt = ds.tokenizer.decode(batches[0]['targets'][0][:1])
  for b in batches:
    for row, w in zip(b['targets'], b['targets_weights'], strict=True):
      rebuilt += ds.tokenizer.decode(row[w > 0])
  assert rebuilt == val_text
  assert ds.eval_examples()[0]['text'] == val_text


def test_lm_two_processes(data_dir, tmp_path):
  config = _lm_config(data_dir)
  shards = [ip.get_datasets(config, workdir=str(tmp_path), process_index=p, process_count=2)
            for p in (0, 1)]
  first = [next(ds.train_iter)['targets'] for ds in shards]
  assert first[0].shape == (4, 65) and not np.array_equal(first[0], first[1])
  weights = [sum(b['targets_weights'].sum() for b in ds.eval_batches()) for ds in shards]
  assert sum(weights) == 111_540 - 1
  assert shards[0].num_eval_batches() == shards[1].num_eval_batches()
