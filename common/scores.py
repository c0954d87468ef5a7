"""Corpus scores of translations with sacreBLEU, each with its signature, defined once for the
trainer's validation BLEU, decode.py's report and a sweep's evaluation.

  bleu             cased BLEU on detokenized text (sacreBLEU's default: the comparable figure)
  bleu_lowercased  BLEU on lowercased text split by the 13a tokenizer: Multi30k papers report
                   multi-bleu.perl on lowercased, tokenized text, which reads higher
  chrf2            chrF (character n-grams, beta 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _metric(name: str):
  import sacrebleu  # pylint: disable=import-outside-toplevel  (only where text is scored)
  return {'bleu': lambda: sacrebleu.metrics.BLEU(),
          'bleu_lowercased': lambda: sacrebleu.metrics.BLEU(lowercase=True, tokenize='13a'),
          'chrf2': lambda: sacrebleu.metrics.CHRF()}[name]()


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str],
                  names: Sequence[str] = ('bleu', 'bleu_lowercased', 'chrf2')) -> dict[str, Any]:
  """name -> (sacreBLEU's score object, its signature string) for one reference per line
  (only the metrics named are built)."""
  hypotheses, refs, out = list(hypotheses), [list(references)], {}
  for name in names:
    metric = _metric(name)
    out[name] = (metric.corpus_score(hypotheses, refs), str(metric.get_signature()))
  return out


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """Cased corpus BLEU on detokenized text -> (score, signature)."""
  score, signature = corpus_scores(hypotheses, references, ('bleu',))['bleu']
  return float(score.score), signature


def report_lines(hypotheses: Sequence[str], references: Sequence[str], *,
                 lowercase_bleu: bool = False) -> list[str]:
  """BLEU (and, with `lowercase_bleu`, lowercased tokenized BLEU to compare with papers) and
  chrF2 -> printable lines with their signatures."""
  names = ('bleu', 'bleu_lowercased', 'chrf2') if lowercase_bleu else ('bleu', 'chrf2')
  found = corpus_scores(hypotheses, references, names)
  labels = {'bleu': 'BLEU', 'bleu_lowercased': 'BLEU (lowercased, tokenized)', 'chrf2': 'chrF2'}
  return [f'{labels[name]} = {score.score:.2f}  {signature}' + (
      f'  ({score})' if name != 'chrf2' else '') for name, (score, signature) in found.items()]
