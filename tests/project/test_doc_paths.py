"""Every repository path that README.md and docs/guide.md name exists (issue 77: the README's
layout listed a module gone since, bench/RESULTS.md a deleted test file). A path is a token
with a `/` whose first part is one of the repository's top-level entries (`model/layers.py`,
`bench/results/`, `tests/model/test_model.py::name`, `../bench/...` from docs/), read without its
`#anchor` or `::test`; placeholders in capitals (`configs/FILE.py`) are skipped. In the README's
layout block, each file name on a folder's lines (`attention.py` under `model/`) must exist
in that folder or below it (or at the root: `decode.py's checks`).
"""

import glob
import os
import re
import subprocess

import pytest

from tests import REPO

DOCS = ('README.md', 'docs/guide.md')
NOT_OURS = {'data/data.json'}  # the guide names a file inside an Orbax checkpoint
_TOKEN = re.compile(r'(?<![\w./:@-])((?:\.\./)*[A-Za-z_][\w.-]*/[\w./*-]*)')
_PLACEHOLDER = re.compile(r'(^|/)([A-Z][A-Z_]+|[\w.]*NNN[\w.]*)(\.\w+)?(/|$)|\*')


def _top_level() -> set[str]:
  """The repository's own top-level entries: git's where it can tell, else the folder's but what
  runs and tools leave there (a checkout without git: an unpacked archive)."""
  try:
    out = subprocess.run(['git', 'ls-files'], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    out = []
  if out:
    return {path.split('/')[0] for path in out}
  return {name for name in os.listdir(REPO) if not name.startswith('.') and name != 'runs'
          and not name.endswith('.egg-info')}


def named_paths(doc: str, top: set[str]) -> list[tuple[int, str, str]]:
  """[(line, as written, path from the root)] of the repository paths `doc` names."""
  with open(os.path.join(REPO, doc), encoding='utf-8') as f:
    text = f.read()
  found = []
  for m in _TOKEN.finditer(text):
    written = re.split(r'#|::', m.group(1))[0].rstrip('.,:;')
    if not written or _PLACEHOLDER.search(written):
      continue
    path = os.path.normpath(os.path.join(os.path.dirname(doc), written)
                            if written.startswith('../') else written)
    if path.split(os.sep)[0] in top and path not in NOT_OURS:
      found.append((text[:m.start()].count('\n') + 1, written, path))
  return found


@pytest.mark.parametrize('doc', DOCS)
def test_every_path_named_exists(doc):
  paths = named_paths(doc, _top_level())
  assert len(paths) > 10, paths  # the pattern still finds them
  missing = [f'{doc}:{line}: {written}' for line, written, path in paths
             if not os.path.exists(os.path.join(REPO, path))]
  assert not missing, missing


def test_the_readmes_layout_names_existing_files():
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    layout = re.search(r'^## Layout\n+```\n(.*?)^```', f.read(), flags=re.M | re.S).group(1)
  folder, checked, missing = '', 0, []
  for line in layout.splitlines():
    if re.match(r'[\w.-]+/', line):
      folder = line.split('/')[0]
    elif not line.startswith(' '):
      folder = ''
    for name in re.findall(r'(?<![\w/.-])([\w-]+\.(?:py|md))\b', line):
      checked += 1
      if not (glob.glob(os.path.join(REPO, folder, '**', name), recursive=True)
              or os.path.exists(os.path.join(REPO, name))):  # a command named in passing
        missing.append(f'{folder}/{name}')
  assert checked > 20 and not missing, (checked, missing)


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


@pytest.mark.parametrize('doc', DOCS)
def test_every_anchor_linked_exists(doc):
  """`[text](FILE.md#anchor)` and `[text](#anchor)` name a heading of that file."""
  with open(os.path.join(REPO, doc), encoding='utf-8') as f:
    links = re.findall(r'\]\(([^)\s]*)#([\w-]+)\)', f.read())
  missing = []
  for target, anchor in links:
    path = os.path.normpath(os.path.join(os.path.dirname(doc), target)) if target else doc
    with open(os.path.join(REPO, path), encoding='utf-8') as f:
      headings = re.findall(r'^#+ (.*)$', re.sub(r'^```.*?^```', '', f.read(), flags=re.M | re.S),
                            flags=re.M)
    if anchor not in {_slug(h) for h in headings}:
      missing.append(f'{target or doc}#{anchor}')
  assert links and not missing, missing
