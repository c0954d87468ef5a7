"""train.py's flag parsing and main once per command line, all in one interpreter (as
tests/decode_mains.py does for decode.py): a process per command line spent ~1 s of CPU on
interpreter and JAX start-up. For command lines that end before training (refusals,
--show_config); the flags train.py defines are dropped before each, as it defines them when it
parses."""

import json
import subprocess
import sys

import test_train_synthetic as syn

_MAIN_PER_ARGS = """
import contextlib, io, json, sys
from absl import flags
import train
FLAGS = flags.FLAGS
absl_flags = set(FLAGS)
results = []
for args in json.loads(sys.argv[1]):
  for name in set(FLAGS) - absl_flags:  # train.py's own flags (--config and its fields too)
    delattr(FLAGS, name)
  FLAGS.unparse_flags()
  sys.argv = ['train.py', *args]
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      train.main(train.parse_flags(sys.argv))
      code = 0
    except SystemExit as e:
      code = e.code
  results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""

def run_mains(runs: list[list[str]]) -> list[tuple[int, str, str]]:
  """(exit status, stdout, stderr) of `train.py ARGS` for each ARGS of `runs`."""
  proc = subprocess.run([sys.executable, '-c', _MAIN_PER_ARGS, json.dumps(runs)], cwd=syn.REPO,
                        env=syn.subprocess_env(1), stdin=subprocess.DEVNULL, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [tuple(result) for result in json.loads(proc.stdout)]
