"""decode.py's main (flag parsing included) once per command line, all in one interpreter: a
process per command line spent ~1.5 s of CPU each on interpreter and JAX start-up."""

import json
import os
import subprocess
import sys

import test_train_synthetic as syn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MAIN_PER_ARGS = """
import contextlib, io, json, sys
import decode
from training import cli
decode._define_flags()
results = []
for args in json.loads(sys.argv[1]):
  decode.FLAGS.unparse_flags()
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      decode.main(cli.parse_absl_flags('decode.py', ['decode.py', *args]))
      code = 0
    except SystemExit as e:
      code = e.code
  results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def run_mains(runs: list[list[str]]) -> list[tuple[int, str, str]]:
  """(exit status, stdout, stderr) of `decode.py ARGS` for each ARGS of `runs`."""
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  env['XLA_FLAGS'] = syn.xla_flags()  # the suite's flags: the same compiles
  env.setdefault('JAX_PLATFORMS', 'cpu')
  proc = subprocess.run([sys.executable, '-c', _MAIN_PER_ARGS, json.dumps(runs)], cwd=ROOT,
                        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [tuple(result) for result in json.loads(proc.stdout)]
