"""autoregressive.program_cache: decoding programs exported to disk give the plain path's
tokens, are loaded (not traced) by a later process, and a damaged file is only re-exported."""

import os

import jax
import numpy as np
import pytest

from autoregressive import program_cache
from autoregressive.strategies.beam import beam_search_decode
from autoregressive.strategies.greedy import greedy_decode
from tests.decoding.test_decode_speed import MAX_LEN, _model, _sources


@pytest.fixture
def cache_dir(tmp_path):
  program_cache.enable(str(tmp_path / 'programs'))
  program_cache._loaded.clear()  # pylint: disable=protected-access
  yield tmp_path / 'programs'
  program_cache.enable(None)
  program_cache._loaded.clear()  # pylint: disable=protected-access


def _searches(model, src):
  greedy = greedy_decode(model, src, max_new_tokens=MAX_LEN)
  tokens, scores = beam_search_decode(model, src, beam_size=2, alpha=0.6,
                                      max_new_tokens=MAX_LEN, nbest=1)
  return [np.asarray(x) for x in (greedy, tokens, scores)]


def _files(directory):
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def test_exported_programs_give_the_same_results_and_load_without_tracing(cache_dir,
                                                                           monkeypatch):
  model = _model(seed=1)
  src = _sources(seed=1)
  program_cache.enable(None)
  plain = _searches(model, src)
  assert _files(cache_dir) == []  # off: nothing written
  program_cache.enable(str(cache_dir))
  first = _searches(model, src)
  assert len(_files(cache_dir)) == 2  # one program per search
  program_cache._loaded.clear()  # pylint: disable=protected-access  # as a new process

  def no_tracing(*args, **kwargs):
    raise AssertionError('traced again')
  monkeypatch.setattr(jax.export, 'export', no_tracing)
  again = _searches(model, src)
  for a, b, c in zip(plain, first, again, strict=True):
    if a.dtype.kind == 'f':  # beam scores: XLA may lay the exported program out otherwise (a
      # size-1 axis' place, under the suite's unoptimised flags), so they may differ in rounding
      np.testing.assert_allclose(b, a, rtol=1e-5)
      np.testing.assert_array_equal(b, c)
    else:
      np.testing.assert_array_equal(a, b)
      np.testing.assert_array_equal(a, c)


def test_a_damaged_program_is_exported_again(cache_dir):
  model = _model(seed=2)
  src = _sources(seed=2)
  expected = np.asarray(greedy_decode(model, src, max_new_tokens=MAX_LEN))
  [name] = _files(cache_dir)
  with open(cache_dir / name, 'wb') as f:
    f.write(b'not a program')
  program_cache._loaded.clear()  # pylint: disable=protected-access
  found = greedy_decode(model, src, max_new_tokens=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(found), expected)
  assert (cache_dir / name).read_bytes() != b'not a program'
  # Other static arguments, other shapes: other programs.
  greedy_decode(model, src, max_new_tokens=MAX_LEN - 1)
  greedy_decode(model, src[:4], max_new_tokens=MAX_LEN)
  assert len(_files(cache_dir)) == 3


def test_another_programs_file_or_a_flipped_bit_is_a_miss(cache_dir):
  """A valid program stored under another program's key (the greedy search's file where the
  beam search's belongs), and a file with one bit flipped, fail only when called: each is a
  miss, exported again and replaced, with the plain path's results."""
  model = _model(seed=3)
  src = _sources(seed=3)
  greedy_decode(model, src, max_new_tokens=MAX_LEN)
  [greedy_file] = _files(cache_dir)
  expected = _searches(model, src)
  [beam_file] = set(_files(cache_dir)) - {greedy_file}
  good = (cache_dir / beam_file).read_bytes()
  flipped = bytearray(good)
  flipped[len(flipped) // 2] ^= 0x04
  for damage in ((cache_dir / greedy_file).read_bytes(), bytes(flipped)):
    (cache_dir / beam_file).write_bytes(damage)
    program_cache._loaded.clear()  # pylint: disable=protected-access  # as a new process
    for got, want in zip(_searches(model, src), expected, strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (cache_dir / beam_file).read_bytes() != damage
