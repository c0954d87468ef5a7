"""Imported first by each command line (train.py, decode.py, export.py, import.py), for its
start-up time: flax.nnx imports IPython where it is installed (~0.3 s) only to ask whether it
runs in a notebook, to colour its reprs. A command line never does (inside IPython, IPython is
imported already and nothing changes), so the import is made to fail fast instead.
"""

import sys

if 'IPython' not in sys.modules:
  sys.modules['IPython'] = None  # `import IPython` raises ImportError: flax takes "no notebook"
