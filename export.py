"""Export a trained model for Hugging Face `transformers`: `python export.py --workdir=DIR --output_dir=OUT`.

Reads the workdir as decode.py does (config.json, tokenizer/, checkpoints/; --step,
--average_last) and writes OUT with config.json, generation_config.json, model.safetensors and
the tokenizer files, so that

  from transformers import AutoTokenizer, AutoModelForSeq2SeqLM   # AutoModelForCausalLM for an LM
  tokenizer = AutoTokenizer.from_pretrained(OUT)
  model = AutoModelForSeq2SeqLM.from_pretrained(OUT)

gives our logits. Targets: MarianMTModel (the paper's post-LN encoder-decoder),
PegasusForConditionalGeneration (pre-LN encoder-decoder), GPT2LMHeadModel (pre-LN decoder-only).
A config no target class can express (e.g. learned or rotary positions in an encoder-decoder,
a post-LN language model) ends with one `export.py: error: ...` line naming the feature,
exit status 2, and nothing written. Needs the `[hf]` extra: pip install -e '.[hf]'.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, 'Training workdir: config.json, tokenizer/, checkpoints/.')
  flags.DEFINE_string('output_dir', None, 'New directory for the transformers model.')
  flags.DEFINE_integer('step', None, 'Checkpoint step to export (default: the newest).')
  flags.DEFINE_integer('average_last', 1, 'Export the average of the last N checkpoints '
                       '(up to --step).')
  flags.DEFINE_bool('overwrite', False, 'Replace --output_dir if it exists and is not empty.')


def _fail(message) -> None:
  print(f'export.py: error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)
  sys.exit(2)


def main(argv) -> None:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]} (flags are --name=value)')
  logging.set_verbosity(logging.ERROR)  # Orbax/JAX info lines would drown the summary
  try:
    from hf_export import ExportError, export_workdir  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    _fail(f'{e}: install the Hugging Face extra (pip install -e \'.[hf]\')')
  try:
    summary = export_workdir(FLAGS.workdir, FLAGS.output_dir, step=FLAGS.step,
                             average_last=FLAGS.average_last, overwrite=FLAGS.overwrite)
  except ExportError as e:
    _fail(e)
  except KeyboardInterrupt:
    _fail('interrupted')
  print(summary, file=sys.stderr, flush=True)


if __name__ == '__main__':
  _define_flags()
  app.run(main)
