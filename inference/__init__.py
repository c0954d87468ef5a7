"""Everything after training: restore a workdir, translate, generate, score and plot.
`decode.py` and `export.py` go through here; the search itself, and the `Session` that runs
it on text, are `autoregressive`'s (below `training`, whose validation BLEU runs them too).

    import inference
    session = inference.load(WORKDIR)                  # an `autoregressive.session.Session`
    print(session.translate(['A man is riding a bike.']))
    print(inference.load(LM_WORKDIR).generate('ROMEO:', num_tokens=50))

`load`, `Restored` and `RestoreError` are `workdir.restore`'s (imported on first use, so
`import inference` is cheap): `load(workdir, *, step, average_last, mesh, warn)` -> `Session`;
`Restored`: config, model, tokenizer and parameters of a workdir (params only; a `scan_layers`
model unrolled once). Modules:
  streaming    lines from a pipe as they arrive, batched without waiting (decode.py)
  plotting     attention heatmaps (PNG) from the weights the model keeps
  decode_cli, decode_runs   decode.py's flag checks and its three runs
"""

from __future__ import annotations

import importlib

_EXPORTS = {'load': 'workdir.restore', 'Restored': 'workdir.restore',
            'RestoreError': 'workdir.restore'}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
