"""Search over a trained model's KV cache, with nothing but `model` below it: what the trainer's
validation BLEU and the `inference` package (decode.py, sessions, export checks) both run.

Modules:
  decoding     `greedy_decode`, `sample`, `beam_search_decode`, `sequence_log_probs` (the public
               contract, re-exported by `inference`), over `decode_loop` and `beam_search`
  translator   `Translator` (batched search over token ids), `Hypothesis`, `Sampling`,
               `generate` (a language model's windows), `until_eos`
  scoring      `forced_log_probs`, `score_references` (fairseq's --score-reference)
  batches      `padded_length` (a batch's length, a multiple of `LENGTH_MULTIPLE`), `in_order`
               (a list of batches on a few worker threads, results in order), `default_workers`
"""
