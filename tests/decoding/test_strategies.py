"""The strategy table (`autoregressive.strategies`): every decoding default and bound is defined
once, in a row's settings, and config.decode, decode.py's flags and `Session` read them; every
row is reachable from decode.py and from a session; a new row needs nothing but itself."""

import dataclasses
import os
import re

import numpy as np
import pytest

from autoregressive import strategies
from autoregressive.strategies import Greedy
from autoregressive.strategies.base import setting
from configs.schema import DecodeConfig
from inference import decode_cli
from tests import REPO
from tests.inference import test_inference

SETTINGS = tuple(strategies.fields())


def test_each_setting_has_one_owner_and_config_decode_reads_it():
  owners = [f.name for owner in (strategies.Limits, *strategies.TABLE.values())
            for f in dataclasses.fields(owner)]
  assert len(owners) == len(set(owners)), owners  # no setting defined by two rows
  for row in strategies.TABLE.values():
    assert row.NAME and row.HELP and issubclass(row, strategies.Strategy)
  decode = {f.name: f for f in dataclasses.fields(DecodeConfig)}
  assert set(decode) - {'num_eval_sentences'} == set(strategies.config_fields())
  for name, (_, field) in strategies.config_fields().items():
    assert decode[name].default == field.default and decode[name].metadata['doc'] == \
        field.metadata['doc'], name


def test_decode_py_flags_are_the_settings():
  flags = {args[0]: (define, args) for define, args in decode_cli.setting_flags()}
  assert set(flags) == {'strategy', *SETTINGS}
  assert flags['strategy'][1][2] == list(strategies.TABLE)
  for name, (_, field) in strategies.fields().items():
    define, (_, default, help_text) = flags[name]
    assert define == ('DEFINE_integer' if field.type == 'int' else 'DEFINE_float'), name
    assert strategies.base.rule_of(field) in help_text, name  # the bound, in the help
    in_config = field.metadata[strategies.base.IN_CONFIG]
    assert default == (None if in_config else field.default), name


# Product code that would define a decoding default or bound again: a literal fallback for a
# setting (`.get('beam_size', 4)`), or a bound constant outside the strategy files.
_SECOND_DEFINITION = re.compile(
    r"""(get\(\s*['"](""" + '|'.join(SETTINGS) + r""")['"]\s*,\s*[-\d.]+)|"""
    r"""(\b(ALPHA_MAX|TEMPERATURE_M(IN|AX)|BEAM_SIZE_MAX|NBEST_MAX|DECODE_BATCH_MAX)\s*=)""")


def test_no_decoding_default_or_bound_outside_the_table():
  found = []
  for directory, dirs, files in os.walk(REPO):
    dirs[:] = [d for d in dirs if d not in ('tests', '.git', 'strategies', 'data', 'docs')
               and not d.startswith('.')]
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(directory, name)
        with open(path, encoding='utf-8') as f:
          found += [f'{os.path.relpath(path, REPO)}: {m.group(0)}'
                    for m in _SECOND_DEFINITION.finditer(f.read())]
  assert not found, found


@pytest.fixture(scope='module')
def session():
  """test_inference's tiny session: the same programs, so the compilation cache serves both."""
  return test_inference._session()


@dataclasses.dataclass(frozen=True)
class _Repeated(Greedy):
  """A new row, as a contributor would add one: greedy decoding, each output `times` times."""
  NAME = 'repeated'
  HELP = 'greedy, repeated'
  times: int = setting(2, 'copies of the greedy output', low=1, high=3, in_config=False)

  def search(self, module, inputs=None, **kw):
    tokens, scores = super().search(module, inputs, **kw)
    return np.repeat(tokens, self.times, axis=1), np.repeat(scores, self.times, axis=1)


def test_every_row_is_reachable_from_a_session_and_a_new_row_needs_only_itself(session,
                                                                                monkeypatch):
  lines = test_inference.LINES  # its shapes: test_inference runs them too
  for name in strategies.TABLE:
    assert session.settings(strategy=name)[0].NAME == name
    assert len(session.translate(lines, strategy=name)) == len(lines)
  monkeypatch.setitem(strategies.TABLE, _Repeated.NAME, _Repeated)
  found = session.hypotheses(lines, strategy='repeated', times=3)
  assert [len(h) for h in found] == [3, 0, 3, 3]
  assert [h[0].text if h else '' for h in found] == session.translate(lines, strategy='greedy')
  with pytest.raises(ValueError, match=r'times=4 must be an integer in \[1, 3\]'):
    session.translate(lines, strategy='repeated', times=4)
  with pytest.raises(ValueError, match='times applies to repeated, not to beam'):
    session.translate(lines, times=2)
  # decode.py's flags come from the table: the new row and its setting are flags too.
  assert {'repeated'} <= set(dict((a[0], a) for _, a in decode_cli.setting_flags())['strategy'][2])
  assert 'times' in {args[0] for _, args in decode_cli.setting_flags()}


# Every row reachable from decode.py: test_decode_cli's test_every_row_is_reachable_from_decode_py
# (its command lines run in that file's one interpreter of decode.py runs: a start-up less).
