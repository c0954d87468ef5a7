"""`transformers` checkpoints in: the inverse of hf_export (import.py).

  import_checkpoint(source, workdir)   read, convert, check, write the workdir -> Imported
  importer.load(directory)             read and convert only (tests compare with transformers)
"""

from __future__ import annotations

import jax
import numpy as np

from hf_import import checkpoint_dir, importer
from hf_import.importer import Imported


def import_checkpoint(source: str, workdir: str) -> Imported:
  """The checkpoint at `source` (a directory or a Hub id) as a new workdir `workdir`."""
  importer.refuse_existing(workdir)  # before any download or conversion
  imported = importer.load(checkpoint_dir.resolve(source))
  importer.write_workdir(imported, workdir)
  return imported


def describe(imported: Imported, source: str, workdir: str) -> str:
  """The one-paragraph summary import.py prints."""
  m = imported.model
  count = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(imported.params))
  layers = '+'.join(str(m[f]) for f in ('num_encoder_layers', 'num_decoder_layers') if m[f])
  return (f'imported {imported.architecture} from {source} into {workdir}: {m["kind"]}, '
          f'{layers} layers, d_model {m["d_model"]}, {m["num_heads"]} heads, d_ff {m["d_ff"]}, '
          f'{m["activation"]}, {count:,} parameters, vocabulary {m["vocab_size"]} '
          f'({imported.tokenizer.name} tokenizer). Next: python decode.py --workdir={workdir}; '
          f'fine-tune with python train.py --workdir=NEW --config.train.init_from={workdir}')
