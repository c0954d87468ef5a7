"""Rules written once and shared: token ids and truncation (`common.tokens`), the "(+N more)"
message (`common.messages`), the UTF-8 line reader (`input_pipeline.textfiles`), and the
training-batch layouts the model kinds name and the input pipeline builds."""

import gzip

import ml_collections
import pytest

from common import messages, tokens
from input_pipeline import datasets, pipeline, textfiles
from input_pipeline.errors import DataError, DataFileError
from model.kinds import ADAPTERS


def test_truncate_keeps_eos():
  assert tokens.truncate([5, 6, 7, tokens.EOS_ID], 3, tokens.EOS_ID) == [5, 6, tokens.EOS_ID]
  assert tokens.truncate([5, 6, 7, 8], 3, None) == [5, 6, 7]  # no EOS (characters): a plain cut
  assert tokens.truncate((5, 6), 3, tokens.EOS_ID) == [5, 6]


def test_first_few():
  assert messages.first_few(['a', 'b']) == 'a; b'
  assert messages.first_few(['a', 'b', 'c', 'd', 'e']) == 'a; b; c (+2 more)'


def test_read_utf8_lines(tmp_path):
  plain, packed = tmp_path / 'a.txt', tmp_path / 'b.txt.gz'
  plain.write_bytes(b'one\r\ntwo \n\nthree')
  with gzip.open(packed, 'wb') as f:
    f.write(b'one\ntwo\n')
  assert textfiles.read_utf8_lines(str(plain)) == ['one', 'two ', '', 'three']
  assert textfiles.read_utf8_lines(str(packed)) == ['one', 'two']
  plain.write_bytes(b'ok\nb\xffd\n')
  with pytest.raises(DataError, match=r'^input .*a.txt line 2 is not valid UTF-8 \(byte 0xff '
                     r'at column 2\)$'):
    textfiles.read_utf8_lines(str(plain), 'input')
  with pytest.raises(DataError, match='line 2 is not valid UTF-8'):
    textfiles.read_text(str(plain))
  with pytest.raises(DataFileError, match='input file not found'):
    textfiles.read_utf8_lines(str(tmp_path / 'missing.txt'), 'input')


def test_every_kind_names_a_layout_the_pipeline_builds():
  for kind, adapter in ADAPTERS.items():
    assert adapter.kind == kind
    assert adapter.batch_layout in pipeline.LAYOUTS, kind
    assert adapter.layer_fields, kind


def _config(kind):
  return ml_collections.ConfigDict({'model': {'kind': kind}, 'data': {'dataset': 'some_set'}})


def test_a_dataset_of_another_layout_is_refused():
  text, pairs = ('text',), ('en', 'de')
  check = datasets._check_layout  # pylint: disable=protected-access
  assert check(None, text, _config('x')) == pipeline.TEXT_BLOCKS  # the dataset's own
  assert check(None, pairs, _config('x')) == pipeline.SENTENCE_PAIRS
  assert check(pipeline.TEXT_BLOCKS, text, _config('x')) == pipeline.TEXT_BLOCKS
  with pytest.raises(DataError, match="kind=lm needs a text dataset; 'some_set' is a "
                     'translation dataset'):
    check(pipeline.TEXT_BLOCKS, pairs, _config('lm'))
  with pytest.raises(DataError, match='needs a translation dataset'):
    check(pipeline.SENTENCE_PAIRS, text, _config('mt'))
  with pytest.raises(DataError, match='is not one of'):
    check('pictures', text, _config('mt'))
