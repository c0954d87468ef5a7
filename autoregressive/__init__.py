"""Search over a trained model's KV cache, with nothing but `model` below it: what the trainer's
validation BLEU and the `inference` package (decode.py, sessions, export checks) both run.

Modules:
  strategies   the strategy table, one file per search, each owning its loop: greedy.py
               (`Greedy`, `greedy_decode`), sampling.py (`Sampling`, `sample`), beam.py
               (`BeamSearch`, `beam_search_decode`, the search); loop.py what they share
               (the first call, the cache windows, row compaction, the one-token-at-a-time
               program); base.py `Limits` (what every strategy takes), `Hypothesis`, `check`
  session      `Session`: text in, text out (translate, hypotheses, score, generate); what
               `inference.load` returns and the trainer's validation BLEU builds
  translator   `Translator` (a strategy over batches of token ids), `generate` (a language
               model's windows)
  scoring      `forced_log_probs`, `score_references` (fairseq's --score-reference)
  batches      `padded_length` (a batch's length, a multiple of `LENGTH_MULTIPLE`), `in_order`
               (a list of batches on a few worker threads, results in order), `default_workers`
"""
