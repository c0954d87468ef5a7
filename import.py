"""Bring a pretrained `transformers` checkpoint into a workdir:
`python import.py --from=PATH_OR_HUB_ID --workdir=NEW_DIR`.

PATH is a directory saved by transformers (`save_pretrained`: config.json, model.safetensors or
pytorch_model.bin, the tokenizer's files); a Hub id (Helsinki-NLP/opus-mt-en-de, gpt2) is
downloaded first when the Hub is reachable. Architectures (hf_import.architectures):

  MarianMTModel (OPUS-MT)  -> an encoder_decoder workdir with MarianTokenizer's files
  GPT2LMHeadModel          -> a decoder_only workdir with its byte-level BPE (tokenizer.json)
  BertModel                -> an encoder_only workdir (the contextual embeddings; no pooler)

NEW_DIR is then a workdir like train.py's, at step 0: `decode.py --workdir=NEW_DIR` translates
or generates, `export.py` writes it back out, and `train.py --workdir=FT
--config.train.init_from=NEW_DIR` fine-tunes it (training.init_from). A checkpoint that uses
something the model cannot express is refused with one line naming the field; so is a
directory that is not a checkpoint, a missing tokenizer file, weights that do not fit their
config, or a NEW_DIR that exists. NEW_DIR appears only once it is complete. Needs the `[hf]`
extra: pip install -e '.[hf]'.
"""

from __future__ import annotations

from absl import app, flags, logging

import common.command_line  # noqa: F401  (first: a faster start, see its docstring)
from common.errors import exit_code

FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('from', None, 'A transformers checkpoint directory, or a Hub id.')
  flags.DEFINE_string('workdir', None, 'New workdir to write (must not exist).')


def main(argv) -> None:
  from workdir import cli  # pylint: disable=import-outside-toplevel
  if len(argv) > 1:
    cli.fail('import.py', f'unexpected arguments {argv[1:]} (flags are --name=value)')
  source, workdir = FLAGS['from'].value, FLAGS.workdir
  if not source or not workdir:
    cli.fail('import.py', '--from=PATH_OR_HUB_ID and --workdir=NEW_DIR are both required')
  logging.set_verbosity(logging.ERROR)
  from hf_import import describe, import_checkpoint  # pylint: disable=import-outside-toplevel
  from hf_import.architectures import Unsupported  # pylint: disable=import-outside-toplevel
  from hf_import.checkpoint_dir import ImportProblem  # pylint: disable=import-outside-toplevel
  try:
    imported = import_checkpoint(source, workdir)
  except (ImportProblem, Unsupported) as e:
    cli.fail('import.py', e, code=exit_code(e))  # 1: a full disk
  except KeyboardInterrupt:
    cli.fail('import.py', f'interrupted; nothing was written at {workdir}', code=130)
  print(describe(imported, source, workdir), flush=True)


if __name__ == '__main__':
  from workdir.cli import absl_flags_parser  # noqa: E402  # before main: bad flags exit 2
  _define_flags()
  app.run(main, flags_parser=absl_flags_parser('import.py'))
