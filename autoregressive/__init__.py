"""Search over a trained model's KV cache, with nothing but `model` below it: what the trainer's
validation BLEU and the `inference` package (decode.py, sessions, export checks) both run.

Modules:
  strategies   the strategy table, one file per search, each owning its loop: greedy.py
               (`Greedy`, `greedy_decode`), sampling.py (`Sampling`, `sample`), beam.py
               (`BeamSearch`, `beam_search_decode`, the search); loop.py what they share
               (the first call, the cache windows, row compaction, the one-token-at-a-time
               program); base.py `Strategy` (the row contract), `Limits` (what every
               strategy takes), `Hypothesis`, `check`, `search_in_batches` (a strategy
               over a list of sources, sorted by length, in batches of a few shapes, on a
               few worker threads)
  session      `Session`: text in, text out (translate, hypotheses, score, generate; `search`
               over token ids); what `inference.load` returns and the trainer's validation
               BLEU builds
  scoring      `forced_log_probs`, `score_references` (fairseq's --score-reference),
               `forced_scores` (the scores of greedy and sampled outputs)

Two doors: `Session` (text, or lists of token ids) and each row's `search` (one batch of
token ids -> tokens `[batch, n, len]`, scores `[batch, n]`: research on the search itself).
"""
