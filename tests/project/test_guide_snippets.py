"""The Python code of docs/guide.md and README.md runs as written, so the guide
cannot go stale: every ```python block is executed in a directory whose `runs/` holds tiny
trained workdirs under the names the guide uses (`runs/default`: a translation model,
`runs/shakespeare`: a character language model, `runs/default_hf` and `runs/default_ct2`: the
first one exported for `transformers` and for CTranslate2). Paths under /tmp/ in a block are
moved into that directory. When a block ends with `# ...` comment lines, they are its expected
output, line for line; a `print(...)  # -> VALUE` line's output must be VALUE.
"""

import contextlib
import io
import os
import re

import pytest

from tests import REPO, export_workdirs, extras
from tests.training import test_train_synthetic as syn

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)

DOCS = ('docs/guide.md', 'README.md')


def python_blocks(path: str) -> list[tuple[str, str]]:
  """[('docs/guide.md:LINE', code)] of the file's ```python blocks (indented ones included)."""
  with open(os.path.join(REPO, path)) as f:
    text = f.read()
  blocks = []
  for m in re.finditer(r'^( *)```python\n(.*?)^\1```', text, flags=re.M | re.S):
    code = '\n'.join(line[len(m.group(1)):] for line in m.group(2).splitlines())
    blocks.append((f'{path}:{text[:m.start()].count(chr(10)) + 1}', code + '\n'))
  return blocks


def _unique_blocks() -> list[tuple[str, str]]:
  seen, out = set(), []
  for path in DOCS:
    for where, code in python_blocks(path):
      if code not in seen:  # the README repeats the guide's export snippet
        seen.add(code)
        out.append((where, code))
  return out


BLOCKS = _unique_blocks()


def expected_output(code: str) -> list[str] | None:
  """The block's trailing '# ...' lines without the '# ', or None when it has none."""
  lines = code.rstrip('\n').splitlines()
  tail = []
  while lines and lines[-1].startswith('# '):
    tail.insert(0, lines.pop()[2:])
  return tail or None


# `print(ARGS)  # -> VALUE`: the line's own expected output.
_INLINE = re.compile(r'^(?P<indent> *)print\((?P<args>.*)\)\s+# -> (?P<value>.*)$')


def with_inline_checks(code: str) -> tuple[str, int]:
  """`code` with each `print(ARGS)  # -> VALUE` line turned into `__expect('VALUE', ARGS)`
  (which prints as print does and records a mismatch), and the number of such lines."""
  lines, count = [], 0
  for line in code.splitlines():
    m = _INLINE.match(line)
    if m:
      count += 1
      line = f'{m["indent"]}__expect({m["value"].strip()!r}, {m["args"]})'
    lines.append(line)
  return '\n'.join(lines) + '\n', count


def _train(workdir: str, config) -> None:
  from training import trainer  # pylint: disable=import-outside-toplevel
  t = config.train
  t.num_steps, t.log_every_steps, t.checkpoint_every_steps, t.eval_every_steps = 2, 1, 2, 2
  t.num_eval_batches = 1
  config.decode.num_eval_sentences = 0
  with contextlib.redirect_stdout(io.StringIO()):
    trainer.train_and_evaluate(config, workdir)


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  """A directory like the repository's root (its `data/` linked), with runs/default (linked to
  the small translation model the export tests share, trained once per session; nothing here
  writes into it) and runs/shakespeare (the tiny preset trained 2 steps, in this process)."""
  from configs import shakespeare_char  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp('guide')
  os.symlink(os.path.join(REPO, 'data'), root / 'data')
  (root / 'runs').mkdir()
  os.symlink(export_workdirs.trained(tmp_path_factory, 'mt'), root / 'runs' / 'default')
  _train(str(root / 'runs' / 'shakespeare'), shakespeare_char.get_config('tiny'))
  return root


def _export_for_transformers(root) -> None:
  extras.require('transformers')
  import hf_export  # pylint: disable=import-outside-toplevel
  target = root / 'runs' / 'default_hf'
  if not target.exists():
    hf_export.export_workdir(str(root / 'runs' / 'default'), str(target))


def _export_for_ctranslate2(root) -> None:
  extras.require('ctranslate2')
  import hf_export  # pylint: disable=import-outside-toplevel
  target = root / 'runs' / 'default_ct2'
  if not target.exists():
    hf_export.export_workdir(str(root / 'runs' / 'default'), str(target), format='ctranslate2')


def test_the_readme_installs_the_cpu_torch_within_pyprojects_bounds():
  """Issue 81, cause 4: `pip install -e '.[test]'` pulled PyPI's CUDA torch (~3.4 GB of
  nvidia-* and triton wheels) on every Python but the one whose CPU wheel lay on disk. The
  README's command 2, and the guide's export section, install torch from PyTorch's CPU index
  first, within the bounds of pyproject.toml's [hf] extra (or pip would replace it)."""
  with open(os.path.join(REPO, 'pyproject.toml')) as f:
    bounds, = re.findall(r'^hf = \[[^\]]*"torch([^";]*)"', f.read(), flags=re.M)
  cpu = f"pip install 'torch{bounds}' --index-url https://download.pytorch.org/whl/cpu"
  with open(os.path.join(REPO, 'README.md')) as f:
    command_2 = re.search(r'^# 2\..*\n(.*)$', f.read(), flags=re.M).group(1)
  assert command_2.startswith(f"{cpu} && pip install -e '.[test]' && "), (command_2, cpu)
  with open(os.path.join(REPO, 'docs', 'guide.md')) as f:
    assert f'\n{cpu}' in f.read(), cpu


def test_the_docs_have_python_blocks():
  where = [w for w, _ in BLOCKS]
  assert any('docs/guide.md' in w for w in where) and len(BLOCKS) >= 4, where
  decoding = [code for _, code in BLOCKS if 'inference.load(' in code]
  assert decoding and min(len(code.splitlines()) for code in decoding) <= 15


@pytest.mark.parametrize('where, code', BLOCKS, ids=[w for w, _ in BLOCKS])
def test_block_runs(site, where, code, monkeypatch):
  if 'default_hf' in code:
    _export_for_transformers(site)
  if 'default_ct2' in code:
    _export_for_ctranslate2(site)
  monkeypatch.chdir(site)
  source, inline = with_inline_checks(code.replace("'/tmp/", f"'{site}/tmp_"))
  out, checked = io.StringIO(), []

  def expect(value, *args):
    text = ' '.join(map(str, args))
    checked.append((text, value))
    print(text)
  with contextlib.redirect_stdout(out):
    exec(compile(source, where, 'exec'), {'__name__': '__guide__', '__expect': expect})  # noqa: S102
  printed = out.getvalue().splitlines()
  assert printed, f'{where} printed nothing'
  assert len(checked) == inline and all(text == value for text, value in checked), (where,
                                                                                    checked)
  expected = expected_output(code)
  if expected is not None:
    assert printed == expected, where
