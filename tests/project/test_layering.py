"""The project's import graph: no cycles, and no package imports one above it.

The graph is read from the source (every `import`, at module level or inside a function;
`if TYPE_CHECKING:` imports are annotations only and do not count), so it needs no imports and
runs in a moment. `python -m tests.project.test_layering` prints it with the counts.
"""

from __future__ import annotations

import ast
import collections
import os
import sys

from tests import REPO

SKIP_DIRS = {'tests', 'data', 'docs', 'runs', '__pycache__'}
# Lowest first. A package may import packages of lower layers only (never its own layer's
# others, never a higher one); the command lines and bench/ sit on top.
LAYERS = (
    ('common',),
    ('model', 'input_pipeline'),
    ('autoregressive', 'optim'),  # the search over the KV cache (the trainer's BLEU uses it);
    # the optimizer's and schedules' tables (config choices) and the weights' moving average
    ('configs',),  # config.decode's fields are the search's settings
    ('workdir',),  # config.json, checkpoints, the lock, restore: what every command reads
    ('training',),
    ('inference',),
    ('hf_export',),
    ('hf_import',),  # the export's conversions, inverted
    ('experiments',),  # sweeps: train.py runs, evaluated through inference
    ('train', 'decode', 'export', 'import', 'sweep'),
    ('bench',),
)
# Upward imports not yet removed, with what still needs them. The test fails on any other,
# and on one of these once it is gone (delete it here then).
KNOWN_UPWARD: dict[str, str] = {}
# Who may import `training` (the loop and what only it needs), with why. Every other package
# and command line reads and writes workdirs through `workdir`.
TRAINING_IMPORTERS = {
    'train': 'the training command line',
    'bench': "benchmarks of the train step, the optimizer's state and the mesh",
}

def _modules() -> dict[str, str]:
  """Dotted module name -> file, for every Python file of the project (tests excluded)."""
  found = {}
  for directory, dirs, files in os.walk(REPO):
    dirs[:] = sorted(d for d in dirs if not d.startswith('.') and d not in SKIP_DIRS
                     and not d.endswith('.egg-info'))
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(directory, name)
        dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
        found[dotted.removesuffix('.__init__')] = path
  return found


def _type_checking_blocks(tree) -> set[int]:
  """ids of the import nodes under `if TYPE_CHECKING:` (annotations only)."""
  ids = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
      ids.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
  return ids


def _only_aliases(tree) -> bool:
  """Whether a module is only another's name: imports, and nothing but a docstring, `__all__`,
  a warning or `sys.modules[__name__] = ...` beside them (a package's `__init__` is its API and
  is not asked)."""
  has_import = False
  for stmt in tree.body:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
      has_import = True
    elif not ((isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Constant, ast.Call)))
              or (isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) in (
                  '__all__', 'sys.modules[__name__]'))):
      return False
  return has_import


def import_graph():
  """(edges {module: {imported project module: function-local?}}, function-local imports
  [(module, line, statement)] of any module, aliases: the modules that only alias others)."""
  modules = _modules()
  edges, local, aliases = collections.defaultdict(dict), [], set()
  for module, path in modules.items():
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read(), path)
    if _only_aliases(tree) and not path.endswith('__init__.py'):
      aliases.add(module)
    skip = _type_checking_blocks(tree)
    in_function = {id(sub) for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for sub in ast.walk(node) if sub is not node}
    for node in ast.walk(tree):
      if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
        continue
      if id(node) in in_function:
        local.append((module, node.lineno, ast.unparse(node)))
      for target in _targets(node, modules):
        if target != module:
          edges[module][target] = edges[module].get(target, False) or id(node) in in_function
  return edges, local, aliases


def _targets(node, modules) -> list[str]:
  """The project modules an import statement loads (`from pkg import sub` loads pkg.sub)."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  elif node.level:
    return []  # the project uses absolute imports only
  else:
    subs = [f'{node.module}.{a.name}' for a in node.names]
    names = [s for s in subs if s in modules]
    if len(names) < len(subs):
      names.append(node.module)
  out = []
  for name in names:
    while name and name not in modules:  # `import a.b.c` of a function: its module
      name = name.rpartition('.')[0]
    if name:
      out.append(name)
  return out


def cycles(edges) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  nodes = set(edges) | {t for targets in edges.values() for t in targets}

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(nodes)))
  for v in sorted(nodes):
    if v not in index:
      visit(v)
  return sorted(found)


def package_edges(edges) -> set[tuple[str, str]]:
  """(importer package, imported package) of the module edges."""
  return {(m.split('.')[0], t.split('.')[0]) for m, targets in edges.items()
          for t in targets if m.split('.')[0] != t.split('.')[0]}


def upward_imports(edges) -> dict[str, list[str]]:
  """{'a -> b': [importing modules]} for each package edge that does not go down the layers."""
  layer = {name: i for i, names in enumerate(LAYERS) for name in names}
  bad = collections.defaultdict(list)
  for module, targets in sorted(edges.items()):
    for target in sorted(targets):
      a, b = module.split('.')[0], target.split('.')[0]
      if a == b:
        continue
      if a not in layer or b not in layer:
        bad[f'{a} -> {b} (a package missing from LAYERS)'].append(module)
      elif layer[b] >= layer[a]:
        bad[f'{a} -> {b}'].append(f'{module} imports {target}')
  return dict(bad)


# ----------------------------------------------------------------------------- tests

def test_no_import_cycles_between_modules():
  edges, _, _ = import_graph()
  assert cycles(edges) == []


def test_no_upward_imports():
  """Hence no cycle between packages either: every other import goes down the layers."""
  edges, _, _ = import_graph()
  found = upward_imports(edges)
  assert {k: v for k, v in found.items() if k not in KNOWN_UPWARD} == {}
  assert sorted(set(KNOWN_UPWARD) - set(found)) == []  # removed: delete it from KNOWN_UPWARD


def test_only_the_training_command_imports_training():
  edges, _, _ = import_graph()
  importers = {module.split('.')[0] for module, targets in edges.items()
               if any(t.split('.')[0] == 'training' for t in targets)} - {'training'}
  assert importers == set(TRAINING_IMPORTERS)


def test_rooms_borrow_nothing_from_command_lines_or_a_rows_insides():
  """What decoding owns (the compilation cache, the cut-line count, the decoding model) is
  imported from autoregressive/'s own modules: no room imports decode.py's modules
  (inference.decode_cli, inference.decode_runs) but inference itself, and nothing outside
  autoregressive/ reaches into a strategy row's shared loop."""
  edges, _, _ = import_graph()
  borrowed = sorted(f'{m} -> {t}' for m, targets in edges.items() for t in targets
                    if (t.startswith(('inference.decode_cli', 'inference.decode_runs'))
                        and not m.startswith(('inference', 'decode')))
                    or (t == 'autoregressive.strategies.loop'
                        and not m.startswith('autoregressive')))
  assert borrowed == []


def test_bottom_layers_hide_no_import_in_a_function():
  """In `common`, `model` and `input_pipeline`, an import inside a function is there only to
  keep a heavy dependency off the import path, and says so on its line."""
  _, local, _ = import_graph()
  bottom = {name for names in LAYERS[:2] for name in names}
  unexplained = [f'{m}:{line}: {stmt}' for m, line, stmt in local
                 if m.split('.')[0] in bottom and not _has_reason(m, line)]
  assert unexplained == []


def _has_reason(module: str, line: int) -> bool:
  """Whether the import on `line` carries a comment other than a bare lint directive."""
  with open(_modules()[module], encoding='utf-8') as f:
    text = f.read().splitlines()[line - 1]
  comment = text.partition('#')[2]
  for directive in ('pylint: disable=import-outside-toplevel',
                    'pylint: disable=g-import-not-at-top', 'noqa'):
    comment = comment.replace(directive, '')
  return bool(comment.strip(' ()'))


def test_the_checker_sees_a_cycle_and_an_upward_import():
  edges = {'model.a': {'model.b': False}, 'model.b': {'model.a': True},
           'input_pipeline.x': {'training.y': True}}
  assert cycles(edges) == [['model.a', 'model.b']]
  assert list(upward_imports(edges)) == ['input_pipeline -> training']


def test_no_module_only_aliases_another():
  """Before 1.0 a moved module leaves no alias behind: every caller imports its new home."""
  _, _, aliases = import_graph()
  assert sorted(aliases) == []


def test_the_checker_sees_an_alias_module():
  alias = ast.parse('"""Moved."""\nimport sys\nfrom a import b\n__all__ = ["b"]\n'
                    'sys.modules[__name__] = b\n')
  assert _only_aliases(alias)
  assert not _only_aliases(ast.parse('"""A package."""\n'))
  assert not _only_aliases(ast.parse('from a import b\n\n\ndef c():\n  return b\n'))


if __name__ == '__main__':
  graph, functions, only_aliases = import_graph()
  print('module cycles:', cycles(graph))
  for pair in sorted(package_edges(graph)):
    print('package import: {} -> {}'.format(*pair))
  for edge, where in upward_imports(graph).items():
    print(f'upward import {edge}: {"; ".join(where)}')
  print('modules that only alias another:', sorted(only_aliases))
  print(f'function-local imports: {len(functions)} '
        f'({sum(1 for m, _, _ in functions if m.split(".")[0] != "bench")} outside bench/)')
  for entry in functions if '-v' in sys.argv else ():
    print('  {}:{} {}'.format(*entry))
