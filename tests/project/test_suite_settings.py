"""The suite's own settings (tests/conftest.py): where its compilation cache is kept."""

import os

from tests import conftest


def test_the_compilation_cache_is_kept_in_the_users_cache_unless_fresh_or_unwritable(
    tmp_path, monkeypatch, capsys):
  monkeypatch.delenv(conftest.TEST_XLA_CACHE_ENV, raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  kept = conftest._kept_cache_dir()  # pylint: disable=protected-access
  assert kept == str(tmp_path / 'xdg' / 'transformer-jax' / 'tests-xla') and os.path.isdir(kept)
  monkeypatch.setenv(conftest.TEST_XLA_CACHE_ENV, str(tmp_path / 'mine'))
  assert conftest._kept_cache_dir() == str(tmp_path / 'mine')  # pylint: disable=protected-access
  monkeypatch.chdir(tmp_path)  # a relative folder is the same for subprocesses in others
  monkeypatch.setenv(conftest.TEST_XLA_CACHE_ENV, 'rel')
  assert conftest._kept_cache_dir() == str(tmp_path / 'rel')  # pylint: disable=protected-access
  monkeypatch.setenv(conftest.TEST_XLA_CACHE_ENV, 'fresh')
  assert conftest._kept_cache_dir() is None  # pylint: disable=protected-access
  # A folder that cannot be made (below a file): an empty cache for the run, and one line.
  (tmp_path / 'afile').write_text('')
  monkeypatch.setenv(conftest.TEST_XLA_CACHE_ENV, str(tmp_path / 'afile' / 'cache'))
  assert conftest._kept_cache_dir() is None  # pylint: disable=protected-access
  err = capsys.readouterr().err
  assert err.startswith(f'conftest: no compilation cache at {tmp_path}/afile/cache (')
  assert err.count('\n') == 1
  # The run's choice: every worker and subprocess of this run shares it.
  assert os.environ['JAX_COMPILATION_CACHE_DIR'] == conftest.XLA_CACHE_DIR
