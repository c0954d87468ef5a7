"""Everything after training: restore a workdir, translate, generate, score and plot.
`decode.py` and `export.py` go through here. The search itself is `autoregressive` (below
`training`, whose validation BLEU runs it too); its public names are re-exported here.

    import inference
    session = inference.load(WORKDIR)                  # a `Session`
    print(session.translate(['A man is riding a bike.']))
    print(inference.load(LM_WORKDIR).generate('ROMEO:', num_tokens=50))

Modules (imported on first use, so `import inference` is cheap):
  session      `load(workdir, *, step, average_last, mesh)` -> `Session`: translate,
               hypotheses (n-best, samples, scores), score (forced decoding), generate
  restore      `Restored`: config, model, tokenizer and parameters of a workdir (params only;
               a `scan_layers` model unrolled once), `RestoreError`, `mesh_from_flag`
  streaming    lines from a pipe as they arrive, batched without waiting (decode.py)
  plotting     attention heatmaps (PNG) from the weights the model sows
Re-exported from `autoregressive`: `Translator`, `Hypothesis`, `Sampling` (translator),
`greedy_decode`, `sample`, `beam_search_decode`, `sequence_log_probs` (decoding),
`forced_log_probs` (scoring)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    'load': 'inference.session', 'Session': 'inference.session',
    'Restored': 'inference.restore', 'RestoreError': 'inference.restore',
    'Translator': 'autoregressive.translator', 'Hypothesis': 'autoregressive.translator',
    'Sampling': 'autoregressive.translator', 'greedy_decode': 'autoregressive.decoding',
    'sample': 'autoregressive.decoding', 'beam_search_decode': 'autoregressive.decoding',
    'sequence_log_probs': 'autoregressive.decoding', 'forced_log_probs': 'autoregressive.scoring',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
