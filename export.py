"""Export a trained model for another engine: `python export.py --workdir=DIR --output_dir=OUT`.

Reads the workdir as decode.py does (config.json, tokenizer/, checkpoints/; --step,
--average_last) and writes OUT.

--format=transformers (default): config.json, generation_config.json, model.safetensors and
the tokenizer files, so that

  from transformers import AutoTokenizer, AutoModelForSeq2SeqLM   # AutoModelForCausalLM for an LM
  tokenizer = AutoTokenizer.from_pretrained(OUT)
  model = AutoModelForSeq2SeqLM.from_pretrained(OUT)

gives our logits. Targets: MarianMTModel (the paper's post-LN encoder-decoder),
PegasusForConditionalGeneration (pre-LN encoder-decoder), GPT2LMHeadModel (pre-LN decoder-only),
BertModel (an imported BERT: a post-LN encoder-only model with LayerNormed embeddings and
learned positions; its last_hidden_state is our encoder's output, no generation_config.json).
Needs the `[hf]` extra: pip install -e '.[hf]'.

--format=ctranslate2: model.bin, config.json and the vocabulary for `ctranslate2.Translator`
(encoder-decoder) or `ctranslate2.Generator` (decoder-only), written from our own
CTranslate2 model spec (our start token, positions and LayerNorm epsilon as they are), so
its greedy and beam search (length_penalty=0) give decode.py's outputs; export_info.json
says which decoding options to pass. Needs the `[ct2]` extra: pip install -e '.[ct2]'.

A sinusoidal translation model is exported with max(max_len, 1024) positions (the sinusoid
is defined everywhere), so both engines run a line past max_len whole with their default
options; a learned table, and a language model, keep max_len positions (docs/guide.md's
"Hugging Face export" and "CTranslate2" say what each engine does past them).

A config the format cannot express (e.g. learned positions in a Marian model, an
encoder-only model without BERT's embedding LayerNorm, any encoder-only model for
CTranslate2) ends with one `export.py: error: ...` line naming the feature, exit
status 2, and nothing written. OUT is never the workdir, inside it or above it, and
--overwrite only replaces a previous export (a directory holding export_info.json).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

import common.command_line  # noqa: F401  (first: a faster start, see its docstring)
from common.errors import exit_code

FLAGS = flags.FLAGS

# The extra that brings each optional package an export imports.
EXTRAS = {'transformers': 'hf', 'safetensors': 'hf', 'tokenizers': 'hf', 'torch': 'hf',
          'sentencepiece': 'hf', 'ctranslate2': 'ct2'}


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, 'Training workdir: config.json, tokenizer/, checkpoints/.')
  flags.DEFINE_string('output_dir', None, 'New directory for the exported model.')
  flags.DEFINE_enum('format', 'transformers', ['transformers', 'ctranslate2'],
                    'transformers (Hugging Face) or ctranslate2 (CTranslate2 Translator / '
                    'Generator).')
  flags.DEFINE_integer('step', None, 'Checkpoint step to export (default: the newest).')
  flags.DEFINE_integer('average_last', 1, 'Export the average of the last N checkpoints '
                       '(up to --step).')
  flags.DEFINE_bool('overwrite', False, 'Replace --output_dir if it holds a previous export '
                    '(export_info.json); any other non-empty directory is refused.')


def _check_flags() -> None:
  from workdir import cli  # pylint: disable=import-outside-toplevel
  cli.check_int('step', FLAGS.step, lo=0, hi=cli.INT32_MAX)
  cli.check_int('average_last', FLAGS.average_last, lo=1, hi=10_000)


def _missing_package(error: ImportError) -> str:
  """One line naming the extra that brings the package `error` is about."""
  name = (error.name or '').split('.')[0]
  extra = EXTRAS.get(name)
  if extra is None:
    return f'cannot import {error.name or error}: {error}'
  return (f'the {FLAGS.format} export needs the Python package {name}, which is not '
          f"installed: pip install -e '.[{extra}]'")


def main(argv) -> None:
  from workdir import cli  # pylint: disable=import-outside-toplevel
  if len(argv) > 1:
    cli.fail('export.py', f'unexpected arguments {argv[1:]} (flags are --name=value)')
  logging.set_verbosity(logging.ERROR)  # Orbax/JAX info lines would drown the summary
  from common import interrupts  # pylint: disable=import-outside-toplevel
  from hf_export import ExportError, export_workdir  # pylint: disable=import-outside-toplevel
  interrupts.stop_on_signals()  # SIGTERM too: the staging directory is removed, nothing published
  try:
    _check_flags()
    summary = export_workdir(FLAGS.workdir, FLAGS.output_dir, step=FLAGS.step,
                             average_last=FLAGS.average_last, overwrite=FLAGS.overwrite,
                             format=FLAGS.format)
  except (cli.UsageError, ExportError) as e:
    cli.fail('export.py', e, code=exit_code(e))  # 1: a full disk
  except ImportError as e:  # an optional package of the format: name its extra
    cli.fail('export.py', _missing_package(e))
  except KeyboardInterrupt:
    cli.fail('export.py', f'interrupted; {FLAGS.output_dir} is as it was', code=130)
  print(summary, file=sys.stderr, flush=True)


if __name__ == '__main__':
  from workdir.cli import absl_flags_parser  # noqa: E402  # before main: bad flags exit 2
  _define_flags()
  app.run(main, flags_parser=absl_flags_parser('export.py'))
