"""Subword regularisation drawn from our own random numbers.

sentencepiece samples segmentations (`encode(..., enable_sampling=True)`) from a generator
that `set_random_generator_seed` does not make reproducible across processes: with
sentencepiece 0.2.3 the same seed gives the same segmentations within one process and other
ones in every new process (measured; tests/input_pipeline/test_subword_sampling.py checks
ours across processes). A resumed run would then train on other batches than an
uninterrupted one. So the two samplers are written here over the model's own pieces and
scores, and draw from `random.Random(seed)`:

- BPE-dropout (Provilkov et al. 2020): sentencepiece's BPE merge loop (the highest-scoring
  mergeable pair first, ties to the left), each merge skipped with probability `alpha`.
  `alpha = 0` is sentencepiece's own encoding (tested).
- Unigram sampling (Kudo 2018): with `nbest_size = -1`, forward-filtering backward-sampling
  over the lattice of every segmentation, a path drawn with probability proportional to
  exp(alpha * its score); with `nbest_size > 1`, one of the n best paths with that
  probability; 0 or 1 is the best path. The best path is sentencepiece's encoding (tested).

The text is normalized by sentencepiece itself, and pieces outside the vocabulary become
byte pieces (byte fallback) or one unknown id per run of unknown characters, as sentencepiece
does.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
import re
from collections.abc import Sequence

from sentencepiece import sentencepiece_model_pb2

_NORMAL, _UNKNOWN, _USER_DEFINED, _UNUSED = 1, 2, 4, 5  # ModelProto.SentencePiece.Type
_BPE, _UNIGRAM = 2, 1  # TrainerSpec.ModelType
_UNK_PENALTY = 10.0  # sentencepiece's kUnkPenalty: an unknown character's score below the least
_WORD = re.compile('[^\u2581]+|\u2581[^\u2581]*')  # split before each ▁ (a word's start)
# Words whose segmentation (BPE: ~0.4 KB each) or sampling table (unigram: ~3.4 KB) is kept,
# cleared when full: at most ~14 / ~110 MB. Multi30k has ~25k word types (measured); a larger
# corpus refills it with its frequent words.
_WORD_CACHE = 1 << 15


class Sampler:
  """`sample(normalized, rng, alpha, nbest_size) -> ids` for one sentencepiece model."""

  def __init__(self, model_proto: bytes):
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    self.model_type = model.trainer_spec.model_type
    if self.model_type not in (_BPE, _UNIGRAM):
      raise ValueError(f'subword sampling needs a bpe or unigram model, not model_type '
                       f'{self.model_type}')
    self.byte_fallback = model.trainer_spec.byte_fallback
    self.ids = {}  # every piece -> id (sentencepiece's PieceToId)
    self.scores = {}  # the pieces a segmentation is built from -> score
    self.unused = set()
    self.user_defined = set()
    self.unk_id = 0
    for i, p in enumerate(model.pieces):
      self.ids.setdefault(p.piece, i)
      if p.type == _UNKNOWN:
        self.unk_id = i
      if p.type in (_NORMAL, _USER_DEFINED, _UNUSED):
        self.scores[p.piece] = p.score
      if p.type == _UNUSED:
        self.unused.add(p.piece)
      if p.type == _USER_DEFINED:
        self.user_defined.add(p.piece)
    normal = [p.score for p in model.pieces if p.type == _NORMAL]
    self.min_score, self.max_score = min(normal), max(normal)
    self.max_chars = max(len(p) for p in self.scores)
    self.max_user_defined = max((len(p) for p in self.user_defined), default=0)
    # No piece holds a ▁ past its start (split_by_whitespace, whitespace as prefix): merges
    # never cross a word's start, so BPE runs word by word, the words' results cached.
    # The same holds for the unigram lattice: every path passes through each word's start,
    # so a path is drawn word by word, each word's lattice and forward sums cached.
    self.by_word = all('\u2581' not in p[1:] for p in self.scores)
    self.pieces = {p: p for p in self.scores}  # one string object per piece (the caches hold it)
    self._words: dict = {}

  # ---------------------------------------------------------------------------- common

  def sample(self, normalized: str, rng: random.Random, alpha: float, nbest_size: int
             ) -> list[int]:
    """Ids of one sampled segmentation of `normalized` (sentencepiece's normalized text)."""
    if not normalized:
      return []
    if self.model_type == _BPE:  # nbest_size does not apply: sentencepiece ignores it too
      pieces = self._bpe_dropout(normalized, rng, alpha)
    else:
      pieces = self._unigram(normalized, rng, alpha, nbest_size)
    return self._to_ids(pieces)

  def _to_ids(self, pieces: list[str]) -> list[int]:
    ids: list[int] = []
    prev_unk = False
    for piece in pieces:
      i = self.ids.get(piece, self.unk_id)
      unk = i == self.unk_id
      if unk and self.byte_fallback:
        ids.extend(self.ids[f'<0x{b:02X}>'] for b in piece.encode('utf-8'))
      elif not (unk and prev_unk):  # a run of unknown characters is one unknown id
        ids.append(i)
      prev_unk = unk
    return ids

  def _user_defined_at(self, text: str, pos: int) -> int:
    """Length of the longest user-defined symbol starting at `pos` (0 if none)."""
    for n in range(min(self.max_user_defined, len(text) - pos), 0, -1):
      if text[pos:pos + n] in self.user_defined:
        return n
    return 0

  # ---------------------------------------------------------------------------- BPE

  def _bpe_dropout(self, text: str, rng: random.Random, alpha: float) -> list[str]:
    if not self.by_word:
      return self._bpe(text, _dropper([], rng, alpha))[0]
    out: list[str] = []
    for word in _WORD.findall(text):
      out.extend(self._bpe_word(word, rng, alpha))
    return out

  def _bpe_word(self, word: str, rng: random.Random, alpha: float) -> list[str]:
    """BPE-dropout of one word. A word whose first `merges` draws drop nothing is its
    deterministic segmentation (the loop pops the same pairs in the same order until a merge
    is dropped), so that is cached per word; otherwise the loop replays those draws."""
    cached = self._words.get(word)
    if cached is None:
      if len(self._words) >= _WORD_CACHE:
        self._words.clear()
      cached = self._words[word] = self._bpe(word, None)
    pieces, merges = cached
    if alpha <= 0:
      return pieces
    draws = [rng.random() for _ in range(merges)] if alpha < 1 else []
    if alpha < 1 and all(u >= alpha for u in draws):
      return pieces
    return self._bpe(word, _dropper(draws, rng, alpha))[0]

  def _bpe(self, text: str, drop) -> tuple[list[str], int]:
    """sentencepiece's BPE merge loop over `text`, each merge skipped where `drop()` says so
    (None: never): (pieces, merges made)."""
    # Symbols: characters, or whole user-defined symbols (never merged: frozen).
    if not self.user_defined:
      pieces, frozen = list(text), [False] * len(text)
    else:
      pieces, frozen = [], []
      pos = 0
      while pos < len(text):
        n = self._user_defined_at(text, pos)
        pieces.append(text[pos:pos + (n or 1)])
        frozen.append(n > 0)
        pos += n or 1
    count = len(pieces)
    prev = list(range(-1, count - 1))
    nxt = list(range(1, count + 1))
    nxt[-1] = -1
    agenda: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)
    rev_merge: dict[str, tuple[str, str]] = {}  # an unused piece -> the two it was merged from

    scores, push, unused = self.scores, heapq.heappush, self.unused

    def add(left: int, right: int) -> None:
      if left < 0 or right < 0 or frozen[left] or frozen[right]:
        return
      merged = pieces[left] + pieces[right]
      score = scores.get(merged)
      if score is None:
        return
      push(agenda, (-score, left, right, len(merged)))
      if unused and merged in unused:
        rev_merge[merged] = (pieces[left], pieces[right])

    for i in range(1, count):
      add(i - 1, i)
    merges = 0
    pop = heapq.heappop
    while agenda:
      _, left, right, size = pop(agenda)
      if not pieces[left] or not pieces[right] or len(pieces[left]) + len(pieces[right]) != size:
        continue  # stale: one side was merged elsewhere since
      if drop is not None and drop():
        continue  # dropped: this pair is tried again only if a neighbour changes
      merges += 1
      pieces[left] += pieces[right]
      pieces[right] = ''
      nxt[left] = nxt[right]
      if nxt[right] >= 0:
        prev[nxt[right]] = left
      add(prev[left], left)
      add(left, nxt[left])

    out: list[str] = []

    def resegment(piece: str) -> None:
      if piece in self.unused and piece in rev_merge:
        for part in rev_merge[piece]:
          resegment(part)
      else:
        out.append(piece)

    i = 0
    while i != -1:
      resegment(pieces[i])
      i = nxt[i]
    return out, merges

  # ---------------------------------------------------------------------------- unigram

  def _lattice(self, text: str) -> list[list[tuple[int, str, float]]]:
    """ends[pos] = [(begin, piece, score)] for every piece of the lattice ending at `pos`
    (sentencepiece's PopulateNodes: an unknown node where no single character is a piece;
    a user-defined symbol scored to be always chosen)."""
    ends: list[list[tuple[int, str, float]]] = [[] for _ in range(len(text) + 1)]
    unk_score = self.min_score - _UNK_PENALTY
    for begin in range(len(text)):
      single = False
      for n in range(1, min(self.max_chars, len(text) - begin) + 1):
        piece = text[begin:begin + n]
        score = self.scores.get(piece)
        if score is None or piece in self.unused:
          continue
        if piece in self.user_defined:
          score = n * self.max_score - 0.1
        ends[begin + n].append((begin, self.pieces[piece], score))
        single = single or n == 1
      if not single:
        ends[begin + 1].append((begin, text[begin], unk_score))
    return ends

  def _unigram(self, text: str, rng: random.Random, alpha: float, nbest_size: int
               ) -> list[str]:
    if nbest_size < 0 and alpha > 0:
      if not self.by_word:
        return _backward(_sampling_table(self._lattice(text), alpha), rng)
      out: list[str] = []
      for word in _WORD.findall(text):
        key = (word, alpha)
        table = self._words.get(key)
        if table is None:
          if len(self._words) >= _WORD_CACHE:
            self._words.clear()
          table = self._words[key] = _sampling_table(self._lattice(word), alpha)
        out.extend(_backward(table, rng))
      return out
    paths = _nbest(self._lattice(text), max(nbest_size, 1))
    if len(paths) == 1 or alpha == 0:
      return paths[0][1]
    top = paths[0][0]
    weights = [math.exp(alpha * (score - top)) for score, _ in paths]
    return rng.choices(paths, weights=weights)[0][1]


def _dropper(draws: list[float], rng: random.Random, alpha: float):
  """drop() for the merge loop: True with probability alpha, replaying `draws` first."""
  replay = iter(draws)

  def drop() -> bool:
    if alpha >= 1:
      return True
    u = next(replay, None)
    return (rng.random() if u is None else u) < alpha
  return drop


def _sampling_table(ends, theta: float) -> list[tuple[tuple, tuple, tuple]]:
  """Forward filtering: for each position, the pieces ending there (their begins, the pieces)
  and the cumulative weights of drawing each when walking back from it: exp(theta * score)
  times the summed weight of the paths reaching its begin."""
  forward = [0.0] + [-math.inf] * (len(ends) - 1)  # log of the paths' summed weight to pos
  table = [((), (), ())]
  for pos in range(1, len(ends)):
    terms = [forward[b] + theta * s for b, _, s in ends[pos]]
    top = max(terms)
    weights = [math.exp(t - top) for t in terms]
    forward[pos] = top + math.log(sum(weights))
    table.append((tuple(b for b, _, _ in ends[pos]), tuple(p for _, p, _ in ends[pos]),
                  tuple(itertools.accumulate(weights))))
  return table


def _backward(table, rng: random.Random) -> list[str]:
  """Backward sampling: a path drawn with probability proportional to exp(theta * the sum of
  its scores) (forward-filtering backward-sampling)."""
  out: list[str] = []
  pos = len(table) - 1
  while pos > 0:
    begins, pieces, cumulative = table[pos]
    k = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
    out.append(pieces[k])
    pos = begins[k]
  return out[::-1]


def _nbest(ends, n: int) -> list[tuple[float, list[str]]]:
  """The n best paths [(score, pieces)], best first (a k-best Viterbi over the lattice)."""
  best: list[list[tuple[float, tuple]]] = [[(0.0, ())]] + [[] for _ in range(len(ends) - 1)]
  for pos in range(1, len(ends)):
    candidates = ((score + s, (piece, path)) for b, piece, s in ends[pos]
                  for score, path in best[b])
    best[pos] = heapq.nlargest(n, candidates, key=lambda c: c[0])
  out = []
  for score, path in best[-1]:
    pieces = []
    while path:
      piece, path = path
      pieces.append(piece)
    out.append((score, pieces[::-1]))
  return out


def sample_batch(sampler: Sampler, normalized: Sequence[str], seed: int, alpha: float,
                 nbest_size: int) -> list[list[int]]:
  """One segmentation of each text, all decided by `seed` alone."""
  rng = random.Random(seed)
  return [sampler.sample(text, rng, alpha, nbest_size) for text in normalized]
