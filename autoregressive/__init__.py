"""Search over a trained model's KV cache, with nothing but `model` below it: what the trainer's
validation BLEU and the `inference` package (decode.py, sessions, export checks) both run.

Modules:
  strategies   the strategy table: `BeamSearch`, `Greedy`, `Sampling` (settings + search each),
               `Limits` (what every strategy takes), `Hypothesis`, `check`, `from_config`
  session      `Session`: text in, text out (translate, hypotheses, score, generate); what
               `inference.load` returns and the trainer's validation BLEU builds
  decoding     `greedy_decode`, `sample`, `beam_search_decode`, `sequence_log_probs` (the
               searches over token ids), over `decode_loop` and `beam_search`
  translator   `Translator` (a strategy over batches of token ids), `generate` (a language
               model's windows)
  scoring      `forced_log_probs`, `score_references` (fairseq's --score-reference)
  batches      `padded_length` (a batch's length, a multiple of `LENGTH_MULTIPLE`), `in_order`
               (a list of batches on a few worker threads, results in order), `default_workers`
"""
