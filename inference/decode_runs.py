"""decode.py's three runs, after its flags were checked (`inference.decode_cli`): translate,
score references, generate. Each writes its outputs as they are ready and one summary line.
"""

from __future__ import annotations

import sys
import time

from autoregressive.strategies.base import stopped_at_limit
from common import interrupts
from inference import streaming
from workdir import cli


def _info(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _chunks(lines, batch_size: int):
  """(first line index, lines): the whole input at once, or a stream's waiting lines."""
  if lines is not None:
    return [(0, lines)]
  return streaming.LineReader().batches(batch_size)


def _rate(count: int, unit: str, seconds: float) -> str:
  return f'{count / max(seconds, 1e-9):.1f} {unit}/s'


def translate(F, session, plan, lines, references) -> None:
  """Translations (or n-best lists, or samples) of every input line, in order."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  settings = dict(plan.settings)
  strategy, limits = session.settings(**settings)  # warns once of a capped max_new_tokens
  settings['max_new_tokens'] = limits.max_new_tokens  # capped: each chunk's call is quiet
  if lines is not None:  # a file: no more rows than sentences
    sentences = max(1, sum(bool(line.strip()) for line in lines))
    settings['batch_size'] = min(limits.batch_size, sentences)
    strategy, limits = session.settings(**settings)
  batch_size, nbest, eos = limits.batch_size, limits.nbest, session.tokenizer.eos_id
  scores = F.output_format == 'jsonl' or nbest > 1
  out, texts, plotted = streaming.Output(F.output_file, workdirs=[F.workdir]), [], []
  seconds, count, tokens, empty, cut = 0.0, 0, 0, 0, 0
  total = None if lines is None else sum(bool(line.strip()) for line in lines)
  with tqdm(total=total, file=sys.stderr, unit='sent', desc='decoding', dynamic_ncols=True,
            disable=lines is None or total <= batch_size) as bar:
    for first, chunk in _chunks(lines, batch_size):
      interrupts.check()  # a Ctrl-C that Python dropped (in a gc callback) stops here
      started = time.perf_counter()
      found = session.hypotheses(chunk, first_line=first + 1, progress=bar.update,
                                 scores=scores, fixed_rows=lines is not None, **settings)
      seconds += time.perf_counter() - started
      for i, (line, hyps) in enumerate(zip(chunk, found, strict=True)):
        out.write(streaming.format_hypotheses(first + i, line, hyps, F.output_format, nbest))
        texts.append(hyps[0].text if hyps else '')
        if not line.strip():
          continue
        count += 1
        tokens += sum(len(h.tokens) for h in hyps[:1])
        empty += not hyps or not hyps[0].text
        cut += bool(hyps) and stopped_at_limit(hyps[0].tokens, limits.max_new_tokens, eos)
        if F.attention_plot and hyps:
          plotted.append((first + i, line, hyps[0].tokens))
  out.close()
  search = strategy.describe()
  if nbest > 1:
    search += f', {nbest} per sentence'
  excluded = '; attention plots not included' if F.attention_plot else ''
  _info(f'translated {count} sentence(s) ({search}) in {seconds:.1f}s: '
        f'{_rate(count, "sentences", seconds)}, {tokens / max(seconds, 1e-9):.0f} tokens/s '
        f'(compilation included{excluded}); {empty} empty, {cut} cut at '
        f'{limits.max_new_tokens} tokens')
  if references is not None:
    from common import scores  # pylint: disable=import-outside-toplevel
    for line in scores.report_lines(texts, references, lowercase_bleu=F.lowercase_bleu):
      _info(line)
  if F.attention_plot:
    plot(F, session, plotted)


def score(F, session, lines, references) -> None:
  """log P(reference | source) of every line pair (forced decoding)."""
  started = time.perf_counter()
  try:
    log_probs = session.score(lines, references, batch_size=F.batch_size)
  except ValueError as e:  # a reference longer than the model's positions
    raise cli.UsageError(str(e)) from None
  seconds = time.perf_counter() - started
  out = streaming.Output(F.output_file, workdirs=[F.workdir])
  for line, reference, log_prob in zip(lines, references, log_probs, strict=True):
    tokens = session.tokenizer.encode(reference, target=True) if log_prob is not None else []
    out.write(streaming.format_reference_score(line, reference, tokens, log_prob,
                                               F.output_format))
  out.close()
  count = sum(p is not None for p in log_probs)
  _info(f'scored {count} reference(s) in {seconds:.1f}s: {_rate(count, "sentences", seconds)} '
        f'(compilation included)')


def generate(F, session, plan, lines) -> None:
  """A language model's continuation of `--prompt` or of each input line (a stream: each
  as it arrives); `\\n` in a prompt is a newline. An empty line gives an empty line."""
  settings = {k: v for k, v in plan.settings.items() if k != 'strategy'}
  settings['num_tokens'] = settings.pop('max_new_tokens', None)
  out, plotted = streaming.Output(F.output_file, workdirs=[F.workdir]), []
  seconds, total, prompts = 0.0, 0, 0
  for first, chunk in _chunks(lines, 1):
    for i, line in enumerate(chunk):
      number = first + i + 1
      if F.prompt is None and not line.strip():
        out.write('\n' if F.output_format == 'text' else
                  streaming.format_generation(line, '', [], F.output_format))
        continue
      prompt = line.replace('\\n', '\n')
      started = time.perf_counter()
      try:
        ids, new = session.generate_ids(prompt, **settings, line=number - 1)
      except ValueError as e:  # a character outside the vocabulary
        raise cli.UsageError(f'prompt {number}: {e}') from None
      seconds += time.perf_counter() - started
      total, prompts = total + len(new), prompts + 1
      out.write(streaming.format_generation(prompt, session.tokenizer.decode(new), new,
                                            F.output_format))
      if F.attention_plot:
        plotted.append((number - 1, None, (ids + new)[:session.module.config.max_len - 1]))
  out.close()
  excluded = '; attention plots not included' if F.attention_plot else ''
  _info(f'generated {total} tokens for {prompts} prompt(s) in {seconds:.1f}s '
        f'({total / max(seconds, 1e-9):.0f} tokens/s, compilation included{excluded})')
  if F.attention_plot:
    plot(F, session, plotted)


def plot(F, session, plotted) -> None:
  """Attention heatmaps of the first `--attention_plot_max` (index, source line or None for a
  language model, output ids), teacher-forced on the outputs, with a progress bar and their
  time."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  from common.tokens import truncate  # pylint: disable=import-outside-toplevel
  from inference import plotting  # pylint: disable=import-outside-toplevel
  limit = F.attention_plot_max
  chosen = plotted[:limit] if limit > 0 else plotted
  # The source ids the search saw (translation warned already about a truncated line).
  tok, positions = session.tokenizer, session.module.config.max_len
  chosen = [(i, None if line is None else truncate(tok.encode(line), positions, tok.eos_id),
             output) for i, line, output in chosen]
  started = time.perf_counter()
  piece = lambda i: session.tokenizer.id_to_piece(int(i))  # noqa: E731
  with tqdm(total=len(chosen), file=sys.stderr, unit='sent', desc='plotting',
            dynamic_ncols=True) as bar:
    written = plotting.plot_lines(session.module, piece, chosen,
                                  F.attention_plot, heads=F.attention_plot_heads,
                                  progress=bar.update)
  more = ''
  if limit and len(plotted) > limit:
    more = f' (the first {limit} sentences; --attention_plot_max=0 plots all)'
  _info(f'wrote {written} attention heatmaps to {F.attention_plot} in '
        f'{time.perf_counter() - started:.1f}s{more}')
