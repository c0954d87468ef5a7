"""Datasets tokenized once (input_pipeline/token_cache.py), your own files prepared streaming
(text_store.py, ragged.py), the exact packer, sampled segmentations, and the bad inputs."""

import errno
import logging
import threading

import numpy as np
import pytest

import input_pipeline as ip
from common import tokens
from configs import shakespeare_char
from input_pipeline import packing, pipeline, ragged, sources, text_store, textfiles, token_cache
from tests import REPO
from tests.input_pipeline.test_input_files import _write
from tests.input_pipeline.test_input_pipeline import BATCH, _mt_config

WORDS = ('the cat sat on a mat while dogs ran far away under blue skies and green trees '
         'near old houses').split()


def _sentences(n, seed):
  rng = np.random.default_rng(seed)
  return [' '.join(rng.choice(WORDS, size=int(rng.integers(3, 14)))) for _ in range(n)]


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """A small parallel corpus and a language model's text, as files."""
  root = tmp_path_factory.mktemp('corpus')
  en, de = _sentences(400, 0), [s.upper() for s in _sentences(400, 0)]
  lm = _sentences(600, 1)
  return {'root': root,
          'train': f"{_write(root / 'train.en.gz', en, gz=True)},{_write(root / 'train.de', de)}",
          'valid': f"{_write(root / 'v.en', en[:50])},{_write(root / 'v.de', de[:50])}",
          'lm_train': (f"{_write(root / 'lm1.txt', lm[:300])},"
                       f"{_write(root / 'lm2.txt.gz', lm[300:550], gz=True)}"),
          'lm_valid': _write(root / 'lm_valid.txt', lm[550:]),
          'en': en, 'de': de, 'lm': lm}


def _pt_config(data_dir, corpus, **data):
  data = {'vocab_size': 300, **data}
  return _mt_config(data_dir, dataset='parallel_text', train_files=corpus['train'],
                    eval_files=corpus['valid'], **data)


def _lm_config(data_dir, corpus, **data):
  config = shakespeare_char.get_config()
  config.data.data_dir = str(data_dir)
  config.data.dataset = 'text_files'
  config.data.tokenizer, config.data.vocab_size = 'sentencepiece', 300
  config.model.vocab_size = 300
  config.data.train_files, config.data.eval_files = corpus['lm_train'], corpus['lm_valid']
  config.train.batch_size = 8
  config.data.max_length = 32
  for k, v in data.items():
    setattr(config.data, k, v)
  return config


def _datasets(config, workdir):
  return ip.get_datasets(config, workdir=str(workdir), process_index=0, process_count=1)


# ----------------------------------------------------------------------------- the ids


def test_cached_ids_are_the_texts_encoding(tmp_path, corpus):
  config = _pt_config(tmp_path / 'tfds', corpus)
  ds = _datasets(config, tmp_path / 'wd')
  for split, n in (('train', 400), ('validation', 50)):
    ids = token_cache.token_ids(config.data, split, ds.tokenizer)
    assert len(ids) == n and ids.arrays['source'].dtype == np.uint16
    for i in range(0, n, 37):
      assert ids.arrays['source'][i].tolist() == ds.tokenizer.encode(corpus['en'][i])
      assert ids.arrays['target'][i].tolist() == ds.tokenizer.encode(corpus['de'][i])
  # Every training example comes from the cache: nothing is encoded per epoch.
  known = {(tuple(tokens.truncate(ds.tokenizer.encode(s), 64, 1)),
            tuple(tokens.truncate(ds.tokenizer.encode(t), 64, 1)))
           for s, t in zip(corpus['en'], corpus['de'], strict=True)}
  batch = next(ds.train_iter)
  for r in range(batch['inputs'].shape[0]):
    row = {k: v[r] for k, v in batch.items()}
    for i, t in zip(packing.unpack(row, 'inputs'), packing.unpack(row, 'targets'), strict=True):
      assert (tuple(i), tuple(t)) in known


def test_a_new_workdir_reuses_the_prepared_data_and_tokenizer(tmp_path, corpus, capfd):
  config = _pt_config(tmp_path / 'tfds', corpus)
  first = _datasets(config, tmp_path / 'wd1')
  assert 'tokenizing the train split' in capfd.readouterr().out
  second = _datasets(config, tmp_path / 'wd2')
  out = capfd.readouterr().out
  assert 'prepar' not in out and 'tokeniz' not in out, out  # read, not prepared again
  assert second.tokenizer.model_proto == first.tokenizer.model_proto
  np.testing.assert_array_equal(next(first.train_iter)['inputs'], next(second.train_iter)['inputs'])


def test_lm_batches_from_the_memory_map_equal_the_in_memory_ones(tmp_path, corpus):
  config = _lm_config(tmp_path / 'tfds', corpus)
  ds = _datasets(config, tmp_path / 'wd')
  stream = ds._ids('train').stream('text')
  assert isinstance(stream, np.memmap)
  expected = np.concatenate([ds.tokenizer.encode(t) for t in corpus['lm'][:550]])
  np.testing.assert_array_equal(stream, expected)  # one document (line) after another, EOS each
  in_memory = pipeline.LMTrainBatch(np.asarray(expected, np.int32), 33, 8, seed=0, process_index=0)
  for step in range(3):
    batch = next(ds.train_iter)
    want = in_memory(step)
    np.testing.assert_array_equal(batch['targets'], want['targets'])
    assert batch['targets'].dtype == np.int32
  assert ds.num_eval_batches() == len(list(ds.eval_batches()))


def test_text_files_train_a_decoder_only_model_config(tmp_path, corpus, caplog):
  lines = corpus['lm'][:20] + ['', '   '] + corpus['lm'][20:40]
  path = _write(tmp_path / 'blank.txt', lines)
  config = _lm_config(tmp_path / 'tfds', corpus, train_files=path, eval_files=None)
  with caplog.at_level(logging.WARNING):
    assert len(sources.get_source(config.data, 'train')) == 40
  assert 'Skipped 2 blank lines of 42' in caplog.text
  with pytest.raises(ip.DataError, match="no split 'validation'"):
    sources.get_source(config.data, 'validation')


# ----------------------------------------------------------------------------- the packer


def _reference_pack(examples, features, length, rng):
  """First-fit decreasing as the plain loop (the packer before it read ragged ids)."""
  n = len(examples)
  lens = np.array([[len(ex[f]) for f in features] for ex in examples], np.int64).reshape(n, -1)
  order = np.argsort(-lens.sum(1), kind='stable')
  room, rows, counts = [], {}, []
  for i in order:
    row = next((r for r, free in enumerate(room) if all(free >= lens[i])), len(room))
    if row == len(room):
      room.append(np.full(len(features), length))
      counts.append(0)
    counts[row] += 1
    rows[i] = (row, length - room[row], counts[row])
    room[row] = room[row] - lens[i]
  out = {}
  for j, f in enumerate(features):
    t, s, p = (np.zeros((len(room), length), np.int32) for _ in range(3))
    for i, ex in enumerate(examples):
      r, off, seg = rows[i][0], rows[i][1][j], rows[i][2]
      t[r, off:off + len(ex[f])], s[r, off:off + len(ex[f])] = ex[f], seg
      p[r, off:off + len(ex[f])] = np.arange(len(ex[f]))
    out[f], out[f'{f}_segmentation'], out[f'{f}_position'] = t, s, p
  perm = rng.permutation(len(room))
  return {k: v[perm] for k, v in out.items()}


@pytest.mark.parametrize('length, n', [(16, 40), (64, 300), (256, 500)])
def test_packer_equals_plain_first_fit_decreasing(length, n):
  rng = np.random.default_rng(length)
  examples = []
  for _ in range(n):
    a = int(min(length, max(1, rng.lognormal(np.log(length / 6), 0.6))))
    b = int(min(length, max(1, a * rng.normal(1, 0.3))))
    examples.append({'inputs': rng.integers(1, 99, a), 'targets': rng.integers(1, 99, b)})
  got = packing.pack_window(examples, ('inputs', 'targets'), length, np.random.default_rng(1))
  want = _reference_pack(examples, ('inputs', 'targets'), length, np.random.default_rng(1))
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# ----------------------------------------------------------------------------- sampling


def test_subword_sampling_is_a_function_of_seed_and_window(tmp_path, corpus):
  # (350 pieces: enough merges of these few words for dropping some to show)
  config = _pt_config(tmp_path / 'tfds', corpus, subword_sampling_alpha=0.3, vocab_size=350)
  ds = _datasets(config, tmp_path / 'wd')
  source = sources.get_source(config.data, 'train')
  read = pipeline.SampledIds(source, ('source', 'target'), ds.tokenizer, 64, seed=0,
                             alpha=0.3, nbest_size=-1)
  indices = np.arange(50)
  a, b, c = read(3, indices), read(3, indices), read(4, indices)
  np.testing.assert_array_equal(a['inputs'][0], b['inputs'][0])
  assert not np.array_equal(a['inputs'][0], c['inputs'][0])  # another window, another sample
  det = [ds.tokenizer.encode(corpus['en'][i]) for i in indices]
  assert [len(x) for x in det] != list(a['inputs'][1])  # BPE-dropout: longer segmentations
  for ids in np.split(a['inputs'][0], np.cumsum(a['inputs'][1])[:-1]):  # the same text
    assert ids[-1] == 1
  texts = [ds.tokenizer.decode(x) for x in np.split(a['inputs'][0], np.cumsum(a['inputs'][1])[:-1])]
  assert texts == [corpus['en'][i] for i in indices]
  # A resumed iterator continues with exactly the batches an uninterrupted one gives.
  next(ds.train_iter)
  state = ds.train_iter.get_state()
  want = [next(ds.train_iter) for _ in range(2)]
  again = _datasets(config, tmp_path / 'wd')
  again.train_iter.set_state(state)
  for w in want:
    got = next(again.train_iter)
    for k in w:
      np.testing.assert_array_equal(got[k], w[k])
  # Evaluation reads the deterministic ids.
  plain = _datasets(_pt_config(tmp_path / 'tfds', corpus, vocab_size=350), tmp_path / 'wd')
  for x, y in zip(ds.eval_batches(), plain.eval_batches(), strict=True):
    np.testing.assert_array_equal(x['inputs'], y['inputs'])


def test_subword_sampling_needs_sentencepiece_translation(tmp_path, corpus):
  from common.errors import ConfigError
  from configs import schema
  config = _lm_config(tmp_path / 'tfds', corpus, subword_sampling_alpha=0.1)
  with pytest.raises(ConfigError, match="needs config.data.tokenizer='sentencepiece' and a "
                     r"translation model \(tokenizer='sentencepiece', model.kind='decoder_only'"):
    schema.check_across(schema.validate_sections(config))  # what train.py checks first
  with pytest.raises(ip.DataError, match='applies to translation'):
    _datasets(config, tmp_path / 'wd')  # and the pipeline, for a config made in Python


# ----------------------------------------------------------------------------- preparation


def test_prepared_once_by_processes_starting_together(tmp_path, corpus, capfd):
  config = _pt_config(tmp_path / 'tfds', corpus)
  tokenizer = _datasets(config, tmp_path / 'wd').tokenizer
  capfd.readouterr()
  results = []

  def prepare():
    results.append(token_cache.token_ids(config.data, 'validation', tokenizer).directory)
  # the validation split is not prepared by get_datasets: both threads race for it
  threads = [threading.Thread(target=prepare) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(set(results)) == 1
  assert capfd.readouterr().out.count('tokenizing the validation split') == 1


def test_a_killed_preparation_leaves_nothing_read_as_done(tmp_path, corpus, monkeypatch):
  config = _pt_config(tmp_path / 'tfds', corpus)
  calls = {'n': 0}
  extend = ragged.RaggedWriter.extend

  def dies(self, rows):  # the process is killed half-way (KeyboardInterrupt: no cleanup code
    calls['n'] += 1     # may turn it into a success)
    if calls['n'] == 2:
      raise KeyboardInterrupt
    extend(self, rows)
  monkeypatch.setattr(ragged.RaggedWriter, 'extend', dies)
  with pytest.raises(KeyboardInterrupt):
    sources.get_source(config.data, 'train')
  dataset = sources.get_builder(config.data)
  assert ragged.read_meta(dataset.directory('train')) is None
  # A staging folder as SIGKILL would leave it: ignored, then removed by the next preparation.
  stage = tmp_path / 'tfds' / 'parallel_text' / ('.staging-' + 'train-x')
  stage.mkdir(parents=True)
  leftover = (tmp_path / 'tfds' / 'parallel_text'
              / f".staging-{dataset.directory('train').rsplit('/', 1)[1]}.dead")
  leftover.mkdir()
  monkeypatch.setattr(ragged.RaggedWriter, 'extend', extend)
  monkeypatch.setattr(sources, '_BUILDERS', {})
  assert len(sources.get_source(config.data, 'train')) == 400
  assert not leftover.exists()


def test_a_changed_file_is_prepared_again_never_read_stale(tmp_path, corpus):
  src = _write(tmp_path / 'a.en', corpus['en'][:100])
  tgt = _write(tmp_path / 'a.de', corpus['de'][:100])
  config = _mt_config(tmp_path / 'tfds', dataset='parallel_text', train_files=f'{src},{tgt}')
  first = sources.get_builder(config.data).directory('train')
  assert sources.as_str(sources.get_source(config.data, 'train')[0]['target']) == corpus['de'][0]
  _write(tmp_path / 'a.de', ['changed'] + corpus['de'][1:100])  # same size class, new bytes
  sources._BUILDERS.clear()
  second = sources.get_builder(config.data).directory('train')
  assert second != first
  assert sources.as_str(sources.get_source(config.data, 'train')[0]['target']) == 'changed'


def test_an_unchanged_file_is_not_read_at_start(tmp_path, monkeypatch):
  path = _write(tmp_path / 'big.txt', ['x' * 100] * 100)
  cache = str(tmp_path / 'hashes')
  first = textfiles.file_fingerprint(path, cache)
  import os
  import time
  past = time.time_ns() - 10_000_000_000
  os.utime(path, ns=(past, past))  # written long before it is hashed (not a racy stat)
  first = textfiles.file_fingerprint(path, cache)
  reads = []
  real = textfiles.open_regular
  monkeypatch.setattr(textfiles, 'open_regular', lambda p: reads.append(p) or real(p))
  assert textfiles.file_fingerprint(path, cache) == first
  assert path not in reads  # the stat matched: the file was not read
  _write(tmp_path / 'big.txt', ['y' * 100] * 100)  # same size, new bytes, new mtime/ctime
  assert textfiles.file_fingerprint(path, cache) != first
  assert path in reads


def test_a_file_changed_while_prepared_fails_and_keeps_nothing(tmp_path, corpus, monkeypatch):
  src = _write(tmp_path / 'a.en', corpus['en'][:100])
  tgt = _write(tmp_path / 'a.de', corpus['de'][:100])
  config = _mt_config(tmp_path / 'tfds', dataset='parallel_text', train_files=f'{src},{tgt}')
  real = textfiles.iter_parallel

  def appended_meanwhile(a, b):
    yield from real(a, b)
    with open(b, 'a') as f:
      f.write('late line\n')
  monkeypatch.setattr(textfiles, 'iter_parallel', appended_meanwhile)
  with pytest.raises(ip.DataError, match='changed while it was being prepared'):
    sources.get_source(config.data, 'train')
  assert ragged.read_meta(sources.get_builder(config.data).directory('train')) is None


# ----------------------------------------------------------------------------- bad input


def _one_line(exc_info):
  message = str(exc_info.value)
  assert '\n' not in message
  return message


def test_not_utf8_names_the_file_line_and_byte(tmp_path):
  good = _write(tmp_path / 'g.en', ['a b', 'c d', 'e f'])
  bad = tmp_path / 'b.de'
  bad.write_bytes(b'x y\nok \xff z\nw\n')
  config = _mt_config(tmp_path / 'tfds', dataset='parallel_text', train_files=f'{good},{bad}')
  with pytest.raises(ip.DataError) as info:
    sources.get_source(config.data, 'train')
  message = _one_line(info)
  assert str(bad) in message and 'line 2' in message and '0xff' in message


def test_line_count_mismatch_streams_and_names_both(tmp_path):
  a = _write(tmp_path / 'a.en', ['s'] * 5)
  b = _write(tmp_path / 'b.de', ['t'] * 7)
  with pytest.raises(ip.DataError) as info:
    list(textfiles.iter_parallel(a, b))
  assert _one_line(info).endswith(f'{a} has 5 lines, {b} has 7')
  with pytest.raises(ip.DataError, match=f'{b} has 7 lines, {a} has 5'):
    list(textfiles.iter_parallel(b, a))


def test_full_disk_is_one_line_and_keeps_nothing(tmp_path, corpus, monkeypatch):
  config = _pt_config(tmp_path / 'tfds', corpus)

  def full(self, rows):
    raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(ragged.RaggedWriter, 'extend', full)
  with pytest.raises(ragged.DiskFullError) as info:
    sources.get_source(config.data, 'train')
  assert 'the disk filled' in _one_line(info) and info.value.exit_code == 1
  root = tmp_path / 'tfds' / 'parallel_text'
  assert [p.name for p in root.iterdir() if not p.name.startswith('.lock')] == []


def test_a_corpus_larger_than_the_disk_is_refused_before_writing(tmp_path, corpus, monkeypatch):
  config = _pt_config(tmp_path / 'tfds', corpus)
  monkeypatch.setattr(ragged, 'free_bytes', lambda path: 1000)
  with pytest.raises(ragged.DiskFullError) as info:
    sources.get_source(config.data, 'train')
  message = _one_line(info)
  assert 'not enough disk' in message and 'GB needed' in message
  root = tmp_path / 'tfds' / 'parallel_text'
  assert not any(p.name.startswith('train') for p in root.iterdir())


def test_text_files_fields(tmp_path, corpus):
  config = _lm_config(tmp_path / 'tfds', corpus, train_files=' , ')
  with pytest.raises(ip.DataError, match=r"config.data.train_files must be 'FILE\[,FILE...\]'"):
    _datasets(config, tmp_path / 'wd')
  assert text_store.split_files(_lm_config(tmp_path, corpus).data)['train'][1].endswith('.gz')
  assert BATCH  # the translation helpers' batch, shared with test_input_pipeline


# ----------------------------------------------------------------------------- the benchmark


def test_data_scale_benchmark_runs_at_a_small_size(tmp_path):
  """bench/data_scale.py at 2,000 pairs (its figures come from the full size: see
  bench/results/input_pipeline.md): every stage runs, and a start reads the prepared data."""
  import json
  import subprocess
  import sys
  out = subprocess.run(
      [sys.executable, 'bench/data_scale.py', '--kind=translation', '--size=2000',
       f'--root={tmp_path}', '--vocab_size=1000', '--batch_size=8', '--max_length=64',
       '--workers=0', '--num_batches=3', '--warmup=1', '--subword_alpha=0.1'],
      cwd=REPO, capture_output=True, text=True, check=True).stdout
  report = json.loads(out)
  assert report['batch'] == [8, 64] and report['size'] == 2000
  assert report['prepare']['peak_rss_gib'] > 0 and report['throughput']['0']['batches_per_s'] > 0
  assert report['sampled']['0']['batches_per_s'] > 0
  for stage in ('start', 'resume'):
    assert report[stage]['first_batch_s'] < report[stage]['wall_s']
  assert 'tokenizing' not in out  # the stages' own output stays in their processes


def test_a_character_model_reads_text_files_with_their_newlines(tmp_path, corpus):
  config = _lm_config(tmp_path / 'tfds', corpus, tokenizer='char')
  ds = _datasets(config, tmp_path / 'wd')
  stream = ds._ids('train').stream('text')
  assert ds.tokenizer.decode(stream[:2000]) == ''.join(s + '\n' for s in corpus['lm'][:550])[:2000]


def test_tokenizer_max_sentences_counts_both_sides(tmp_path, corpus):
  from input_pipeline import tokenizers
  config = _pt_config(tmp_path / 'tfds', corpus, tokenizer_max_sentences=100)
  texts = list(tokenizers._training_texts(config.data, 100))
  assert len(texts) == 100  # 50 pairs, evenly strided over the 400
  assert texts[:2] == [corpus['en'][0], corpus['de'][0]] and texts[2] == corpus['en'][8]
