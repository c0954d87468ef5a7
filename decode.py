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
  ... --strategy=sampling --temperature=0.7 --nbest=3 --seed=1   # 3 sampled translations
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

import common.command_line  # noqa: F401  (first: a faster start, see its docstring)
from common.errors import exit_code
from inference import decode_cli
from workdir import cli

FLAGS = flags.FLAGS
PROG = 'decode.py'


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, 'Training workdir: config.json, tokenizer/, checkpoints/.')
  flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: the newest).')
  flags.DEFINE_integer('average_last', 1, 'Average the parameters of the last N checkpoints '
                       '(up to --step) before decoding.')
  flags.DEFINE_string('input_file', None, 'Sentences (or LM prompts), one a line; default (or '
                      '-): stdin, translated line by line as it arrives when it is a pipe.')
  flags.DEFINE_string('output_file', None, 'Where to write the outputs; default: stdout, each '
                      'line as it is ready. A file is written into a temporary file beside it '
                      'and renamed when the run ends: it appears whole, and a failed or '
                      'interrupted run leaves it as it was. Never a symlink, FIFO, device or a '
                      "workdir's own file.")
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
  for define, args in decode_cli.setting_flags():  # the decoding settings' (one definition)
    getattr(flags, define)(*args)
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
  """A language model's flags (its sampling settings are the decoding settings' flags)."""
  flags.DEFINE_string('prompt', None, 'Language model: text to continue (\\n = a newline).')
  flags.DEFINE_integer('num_tokens', None, 'Language model: tokens to generate; default '
                       'config.decode.max_new_tokens. Longer than the model\'s context is done in '
                       'windows (the context is cut to its last half).')


# ----------------------------------------------------------------------------- main

def main(argv) -> None:
  if len(argv) > 1:
    cli.fail(PROG, f'unexpected arguments {argv[1:]} (flags are --name=value)')
  logging.set_verbosity(logging.ERROR)  # Orbax/JAX info lines would drown the output
  try:
    decode_cli.run(FLAGS)
  except cli.UsageError as e:
    cli.fail(PROG, e, code=exit_code(e))  # 1: a full disk, a damaged tokenizer file
  except KeyboardInterrupt:
    cli.fail(PROG, 'interrupted', code=130)
  except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
    sys.exit(1)


if __name__ == '__main__':
  from common import interrupts
  # A Ctrl-C during the start-up raised KeyboardInterrupt inside JAX's gc callback, where
  # Python drops it, and the whole file was decoded: remembered, it stops at the next chunk.
  interrupts.stop_on_signals()
  _define_flags()
  app.run(main, flags_parser=cli.absl_flags_parser(PROG))
