"""Everything after training: restore a workdir, search over the KV cache, translate, generate,
score and plot. `decode.py`, `export.py` and the trainer's validation BLEU all go through here.

    import inference
    session = inference.load(WORKDIR)                  # a `Session`
    print(session.translate(['A man is riding a bike.']))
    print(inference.load(LM_WORKDIR).generate('ROMEO:', num_tokens=50))

Modules (imported on first use, so `import inference` is cheap):
  session      `load(workdir, *, step, average_last, mesh)` -> `Session`: translate,
               hypotheses (n-best, samples, scores), score (forced decoding), generate
  restore      `Restored`: config, model, tokenizer and parameters of a workdir (params only;
               a `scan_layers` model unrolled once), `RestoreError`, `mesh_from_flag`
  translator   `Translator` (batched search over token ids), `Hypothesis`, `Sampling`,
               `generate` (a language model's windows), `truncate`, `until_eos`
  decoding     `greedy_decode`, `sample`, `beam_search_decode`, `sequence_log_probs`
               (the public contract's `model.decoding`), over `decode_loop` and `beam_search`
  scoring      `forced_log_probs`, `score_references` (fairseq's --score-reference)
  streaming    lines from a pipe as they arrive, batched without waiting (decode.py)
  plotting     attention heatmaps (PNG) from the weights the model sows
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    'load': 'session', 'Session': 'session',
    'Restored': 'restore', 'RestoreError': 'restore',
    'Translator': 'translator', 'Hypothesis': 'translator', 'Sampling': 'translator',
    'greedy_decode': 'decoding', 'sample': 'decoding', 'beam_search_decode': 'decoding',
    'sequence_log_probs': 'decoding', 'forced_log_probs': 'scoring',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f'inference.{_EXPORTS[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
