"""Which project files a request runs through, by a profiler: the redesign's "files a beam
search crosses" and "files one override crosses" (bench/RESULTS.md, "Redesign step 4").

  python bench/code_paths.py                    # this checkout
  python bench/code_paths.py --repo=../before   # another checkout of the project (its code)

Prints JSON: for each request, the project files (tests and bench/ left out) with a function
that ran while `sys.setprofile`'s hook was on, and how many of them are in autoregressive/.
  beam      a warm `Session.translate` (beam 4) on a tiny random translation model: the
            second call, so that tracing and compiling are not counted
  override  train.py's flag parsing of `--config=configs/multi30k.py
            --config.model.dropout_rate=0.2 --show_config`: the preset loaded, the override
            read, checked and applied (train.py imported first, so module bodies do not count)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

ALPHABET = 'abcdefghijklmnopqrstuvwxyz '
LINES = ['a dog runs', 'two men sit on a bench', 'x', 'a girl in a red coat']


class _Tokenizer:
  """Characters as ids 3.. and EOS = 1 (sentencepiece's pad=0, eos=1, unk=2)."""
  eos_id = 1

  def encode(self, text, target=False):
    del target
    return [3 + ALPHABET.index(c) for c in text] + [self.eos_id]

  def decode(self, ids):
    return ''.join(ALPHABET[i - 3] for i in ids if 3 <= i < 3 + len(ALPHABET))


@contextlib.contextmanager
def _files_run(root: str, found: set[str]):
  """Adds to `found` the project files (relative to `root`) whose functions are called."""
  skip = (os.path.join(root, 'tests') + os.sep, os.path.join(root, 'bench') + os.sep)
  paths: set[str] = set()

  def importing(frame) -> bool:  # a module's body runs above it: an import, not the request
    frame = frame.f_back
    while frame is not None:
      if frame.f_code.co_name == '<module>' and frame.f_code.co_filename != __file__:
        return True
      frame = frame.f_back
    return False

  def hook(frame, event, arg):
    del arg
    if event == 'call' and frame.f_code.co_name != '<module>':
      path = os.path.abspath(frame.f_code.co_filename)  # a config file may load relative
      if (path.startswith(root + os.sep) and not path.startswith(skip) and os.path.isfile(path)
          and path not in paths and not importing(frame)):
        paths.add(path)
        found.add(os.path.relpath(path, root))
  sys.setprofile(hook)
  try:
    yield found
  finally:
    sys.setprofile(None)


def beam(root: str) -> set[str]:
  import jax  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  from autoregressive.session import Session  # pylint: disable=import-outside-toplevel
  from model import ModelConfig, bind, build_model, params_of  # pylint: disable=import-outside-toplevel
  cfg = ModelConfig(kind='encoder_decoder', vocab_size=3 + len(ALPHABET), num_encoder_layers=1,
                    num_decoder_layers=2, d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0,
                    max_len=32)
  params = jax.tree.map(lambda x: x * 2.0, params_of(build_model(cfg, rngs=nnx.Rngs(0))))
  config = ml_collections.ConfigDict({'decode': dict(
      beam_size=4, alpha=0.6, max_new_tokens=16, batch_size=4, temperature=1.0, top_k=0)})
  session = Session(bind(cfg, params), _Tokenizer(), config, step=0, warn=lambda message: None)
  cold = session.translate(LINES, beam_size=4)
  with _files_run(root, set()) as found:
    warm = session.translate(LINES, beam_size=4)
  assert warm == cold, (cold, warm)
  return found


def override(root: str) -> set[str]:
  import train  # pylint: disable=import-outside-toplevel
  argv = ['train.py', '--config=configs/multi30k.py', '--config.model.dropout_rate=0.2',
          '--show_config']
  sys.argv = argv  # config_flags finds the overrides' names in sys.argv
  with _files_run(root, set()) as found:
    train.parse_flags(argv)
  config = train.RESOLVED.config if hasattr(train, 'RESOLVED') else train.FLAGS.config
  assert config.model.dropout_rate == 0.2, config.model.dropout_rate
  return found


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--repo', default=os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), help='the checkout whose code runs (default: this one)')
  parser.add_argument('--only', default='beam,override', help='comma-separated: beam,override')
  args = parser.parse_args()
  root = os.path.realpath(args.repo)
  os.chdir(root)
  sys.path.insert(0, root)
  out = {'repo': root}
  for name in args.only.split(','):
    files = sorted({'beam': beam, 'override': override}[name](root))
    out[name] = {'files': len(files), 'in_autoregressive': sum(
        f.startswith('autoregressive' + os.sep) for f in files), 'paths': files}
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
