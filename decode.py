"""Translate, generate or score with a trained checkpoint: `python decode.py --workdir=DIR [...]`.

Needs only the workdir (config.json, tokenizer/, checkpoints/): no dataset, no training code
path, and it restores onto whatever devices exist; `--mesh=1,2,4` shards the parameters as
training does and decodes tensor-parallel. Nothing in the workdir is modified. The work is
done by the `inference` package (`inference.load(DIR)` does the same from Python).

Translation (encoder-decoder), one sentence per line, output in input order:
  python decode.py --workdir=/tmp/run --input_file=test.en --output_file=test.de \\
      --reference=test.de.ref --beam_size=4 --alpha=0.6 --attention_plot=/tmp/plots
  python decode.py --workdir=/tmp/run          # interactive: each line answered as it comes
  ... --nbest=4 [--output_format=jsonl]        # n-best: `index<TAB>score<TAB>text` lines
  ... --sample --temperature=0.7 --nbest=3 --seed=1   # 3 sampled translations per line
  ... --input_file=test.en --score_reference=test.de  # log P(reference | source) per line

A pipe or a terminal on stdin (or `--input_file=-`) is translated as lines arrive (the lines
already waiting share a batch; none waits for more); a file is read whole, sorted by length and
decoded in full batches with a progress bar. An empty line gives an empty output line.

Language model (decoder-only), `--prompt` or one prompt a line (printed with its continuation):
  python decode.py --workdir=/tmp/lm --prompt="ROMEO:" --num_tokens=300 \\
      --temperature=0.8 --top_k=40 --seed=0

Outputs go to stdout (or --output_file); BLEU/chrF, warnings and progress go to stderr. A bad
flag, a flag that does not apply to the model or the mode, or bad input (no checkpoint,
non-UTF-8 line, reference with a different line count, ...) ends with one `decode.py: error:
...` line and exit status 2.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from common.tokens import DEFAULT_MIN_NEW_TOKENS, truncate
from training import cli

FLAGS = flags.FLAGS
PROG = 'decode.py'


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, 'Training workdir: config.json, tokenizer/, checkpoints/.')
  flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: the newest).')
  flags.DEFINE_integer('average_last', 1, 'Average the parameters of the last N checkpoints '
                       '(up to --step) before decoding.')
  flags.DEFINE_string('input_file', None, 'Sentences (or LM prompts), one a line; default (or '
                      '-): stdin, translated line by line as it arrives when it is a pipe.')
  flags.DEFINE_string('output_file', None, 'Where to write the outputs; default: stdout.')
  flags.DEFINE_enum('output_format', 'text', ['text', 'jsonl'], 'text: one line per input (with '
                    '--nbest>1, a line index<TAB>score<TAB>text per hypothesis, index = the input '
                    'line from 0, none for an empty line); jsonl: one object per input, {"source", '
                    '"hypotheses": [{"text", "score", "log_prob", "tokens"}]} best first (score: '
                    'the search\'s, length-normalised for beam search; log_prob: the sum of the '
                    'token log-probabilities; a language model writes {"prompt", "text", '
                    '"tokens"}).')
  flags.DEFINE_string('reference', None, 'Reference translations, one a line: prints sacreBLEU '
                      'BLEU and chrF with their signatures.')
  flags.DEFINE_string('score_reference', None, 'Reference translations, one a line: write each '
                      'one\'s log-probability under the model given its source (forced '
                      'decoding, as fairseq-generate --score-reference; EOS included): '
                      'log_prob<TAB>reference per line (an empty line for an empty source), or '
                      'jsonl {"source", "reference", "log_prob", "tokens"}.')
  flags.DEFINE_bool('lowercase_bleu', False, 'With --reference, also print BLEU on lowercased, '
                    'tokenized text (sacreBLEU lowercase=True, tok 13a), as Multi30k papers '
                    'score it, beside the cased detokenized BLEU.')
  flags.DEFINE_integer('beam_size', None, 'Beam size (1: greedy); default config.decode.beam_size')
  flags.DEFINE_float('alpha', None, 'GNMT length penalty exponent in [0, 10]; default '
                     'config.decode.alpha.')
  flags.DEFINE_integer('nbest', 1, 'Hypotheses per input, best first (at most the beam size; '
                       'with --sample, the number of samples).')
  flags.DEFINE_bool('sample', False, 'Translation: sample from the model instead of searching '
                    '(--temperature, --top_k, --top_p, --seed; --beam_size=1 with one of them '
                    'samples too).')
  flags.DEFINE_integer('max_new_tokens', None, 'Maximum generated tokens per sentence; default '
                       'config.decode.max_new_tokens (at most the model\'s max_len).')
  flags.DEFINE_integer('min_new_tokens', None, 'Generated tokens before EOS may end an output '
                       '(every search; a language model too); default '
                       'config.decode.min_new_tokens (1: no empty output; 0: EOS may come '
                       'first).')
  flags.DEFINE_integer('batch_size', None, 'Sentences per batch; default config.decode.batch_size.')
  flags.DEFINE_string('attention_plot', None, 'Directory for attention heatmaps (PNG): one '
                      'folder per sentence, an overview and a file per attention module, layer '
                      'and head + the head average.')
  flags.DEFINE_integer('attention_plot_max', 5, 'Plot at most this many sentences (0 = all).')
  flags.DEFINE_enum('attention_plot_heads', 'all', ['all', 'average'],
                    'Plot every head and the average, or only the average.')
  _define_generation_flags()
  flags.DEFINE_string('mesh', None, 'DATA,FSDP,TENSOR device counts (-1 = the remaining '
                      'devices), e.g. 1,2,4: parameters sharded as in training (config.json\'s '
                      'mesh.rules), decoding tensor-parallel, same tokens. Default: one device.')
  flags.DEFINE_string('compilation_cache', '~/.cache/transformer_decode_xla',
                      'JAX persistent compilation cache directory (\'\' = none): repeated runs '
                      'with the same shapes start without compiling. Never inside --workdir.')


def _define_generation_flags() -> None:
  """A language model's flags, and sampling's (a translation model samples with --sample)."""
  flags.DEFINE_string('prompt', None, 'Language model: text to continue (\\n = a newline).')
  flags.DEFINE_integer('num_tokens', None, 'Language model: tokens to generate; default '
                       'config.decode.max_new_tokens. Longer than the model\'s context is done in '
                       'windows (the context is cut to its last half).')
  flags.DEFINE_float('temperature', None, 'Sampling temperature: 0 (greedy) or in [0.001, '
                     '1000]; default config.decode.temperature.')
  flags.DEFINE_integer('top_k', None, 'Sample from the k most likely tokens (0 = all); '
                       'default config.decode.top_k.')
  flags.DEFINE_float('top_p', None, 'Nucleus sampling: the fewest tokens of this mass, in (0, 1] '
                     '(1 = off).')
  flags.DEFINE_integer('seed', 0, 'Random seed for sampling (a line\'s samples depend only on '
                       'the seed and its line number).')


class DecodeError(cli.UsageError):
  """A user-facing error: printed as one line, no traceback."""


def _warn(message: str) -> None:
  print(f'{PROG}: warning: {message}', file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- for Python callers

def read_lines(path: str | None, what: str = 'input') -> list[str]:
  """UTF-8 lines of `path` (stdin when None or '-'; `.gz` decompressed), without newlines."""
  from inference import streaming  # pylint: disable=import-outside-toplevel
  try:
    return streaming.read_lines(path, what)
  except streaming.InputError as e:
    raise DecodeError(str(e)) from None


def restore(workdir: str, step: int | None, average_last: int, mesh=None):
  """The `inference.Session` of a workdir holding a model with a decoder (its parameters on
  one device, or sharded over `mesh`): `module`, `params`, `tokenizer`, `config`, `step`."""
  from inference import decode_cli  # pylint: disable=import-outside-toplevel
  try:
    return decode_cli.restore(workdir, step, average_last, mesh)
  except cli.UsageError as e:
    raise DecodeError(str(e)) from None


def encode_sources(tokenizer, lines, max_source_len: int):
  """Token ids per line (EOS-terminated); empty lines -> None; long ones truncated (with a
  warning) by the rule of `common.tokens.truncate`."""
  out = []
  for number, line in enumerate(lines, start=1):
    ids = list(tokenizer.encode(line)) if line.strip() else None
    if ids is not None and len(ids) > max_source_len:
      _warn(f'input line {number} has {len(ids)} tokens, more than the model\'s max_len '
            f'{max_source_len}; truncated')
    out.append(None if ids is None else truncate(ids, max_source_len, tokenizer.eos_id))
  return out


def translate(session, sources, *, beam_size, alpha, max_new_tokens, batch_size,
              min_new_tokens=DEFAULT_MIN_NEW_TOKENS, progress=True):
  """Output ids per source (None for empty), in order (`inference.Translator`, as decode.py
  and the trainer's BLEU run it)."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  import inference  # pylint: disable=import-outside-toplevel
  translator = inference.Translator(session.module, session.params, beam_size=beam_size,
                                    alpha=alpha, max_new_tokens=max_new_tokens,
                                    min_new_tokens=min_new_tokens, batch_size=batch_size,
                                    eos_id=session.tokenizer.eos_id)
  count = sum(s is not None for s in sources)
  with tqdm(total=count, file=sys.stderr, unit='sent', desc='decoding', dynamic_ncols=True,
            disable=not progress or count <= batch_size) as bar:
    return translator(sources, progress=bar.update)


def score(hypotheses, references, lowercase_bleu=False) -> list[str]:
  """sacreBLEU BLEU (and lowercased BLEU) and chrF lines with their signatures."""
  from training import evaluation  # pylint: disable=import-outside-toplevel
  return evaluation.score_report(hypotheses, references, lowercase_bleu=lowercase_bleu)


# ----------------------------------------------------------------------------- main

def main(argv) -> None:
  if len(argv) > 1:
    cli.fail(PROG, f'unexpected arguments {argv[1:]} (flags are --name=value)')
  logging.set_verbosity(logging.ERROR)  # Orbax/JAX info lines would drown the output
  from inference import decode_cli  # pylint: disable=import-outside-toplevel
  try:
    decode_cli.run(FLAGS)
  except cli.UsageError as e:
    cli.fail(PROG, e, code=getattr(e, 'exit_code', 2))  # 1: a damaged tokenizer file
  except KeyboardInterrupt:
    cli.fail(PROG, 'interrupted', code=130)
  except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
    sys.exit(1)


if __name__ == '__main__':
  _define_flags()
  app.run(main, flags_parser=cli.absl_flags_parser(PROG))
