"""Translate or generate with a trained checkpoint: `python decode.py --workdir=DIR [...]`.

Needs only the workdir (config.json, tokenizer/, checkpoints/): no dataset, no training code
path, and it restores onto whatever devices exist; `--mesh=1,2,4` shards the parameters as
training does and decodes tensor-parallel. Nothing in the workdir is modified.

Translation (encoder-decoder), one sentence per line, output in input order:
  python decode.py --workdir=/tmp/run --input_file=test.en --output_file=test.de \\
      --reference=test.de.ref --beam_size=4 --alpha=0.6 --attention_plot=/tmp/plots
  echo "A man is riding a bike." | python decode.py --workdir=/tmp/run

Language model (decoder-only):
  python decode.py --workdir=/tmp/lm --prompt="ROMEO:" --num_tokens=300 \\
      --temperature=0.8 --top_k=40 --seed=0

Translations go to stdout (or --output_file); BLEU/chrF, warnings and the progress bar go
to stderr. Bad input (no checkpoint, wrong model kind, non-UTF-8 line, reference with a
different line count, ...) ends with one `decode.py: error: ...` line and exit status 2.
"""

from __future__ import annotations

import gzip
import math
import os
import sys
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, 'Training workdir: config.json, tokenizer/, checkpoints/.')
  flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: the newest).')
  flags.DEFINE_integer('average_last', 1, 'Average the parameters of the last N checkpoints '
                       '(up to --step) before decoding.')
  flags.DEFINE_string('input_file', None, 'Sentences (or LM prompts), one a line; default stdin.')
  flags.DEFINE_string('output_file', None, 'Where to write the outputs; default: stdout.')
  flags.DEFINE_string('reference', None, 'Reference translations, one a line: prints sacreBLEU '
                      'BLEU and chrF with their signatures.')
  flags.DEFINE_bool('lowercase_bleu', False, 'With --reference, also print BLEU on lowercased, '
                    'tokenized text (sacreBLEU lowercase=True, tok 13a), as Multi30k papers '
                    'score it, beside the cased detokenized BLEU.')
  flags.DEFINE_integer('beam_size', None, 'Beam size (1: greedy); default config.decode.beam_size')
  flags.DEFINE_float('alpha', None, 'GNMT length penalty exponent; default config.decode.alpha.')
  flags.DEFINE_integer('max_len', None, 'Maximum generated tokens per sentence; default '
                       'config.decode.max_len (at most the model\'s max_len).')
  flags.DEFINE_integer('batch_size', None, 'Sentences per batch; default config.decode.batch_size.')
  flags.DEFINE_string('attention_plot', None, 'Directory for attention heatmaps (PNG): one '
                      'folder per sentence, a file per attention module, layer and head + '
                      'the head average.')
  flags.DEFINE_integer('attention_plot_max', 5, 'Plot at most this many sentences (0 = all).')
  flags.DEFINE_enum('attention_plot_heads', 'all', ['all', 'average'],
                    'Plot every head and the average, or only the average.')
  # Language model.
  flags.DEFINE_string('prompt', None, 'Language model: text to continue.')
  flags.DEFINE_integer('num_tokens', None, 'Language model: tokens to generate; default '
                       'config.decode.max_len. Longer than the model\'s context is done in '
                       'windows (the context is cut to its last half).')
  flags.DEFINE_float('temperature', None, 'Language model sampling temperature (0 = greedy); '
                     'default config.decode.temperature.')
  flags.DEFINE_integer('top_k', None, 'Sample from the k most likely tokens (0 = all); '
                       'default config.decode.top_k.')
  flags.DEFINE_float('top_p', None, 'Nucleus sampling: the fewest tokens of this mass (1 = off).')
  flags.DEFINE_integer('seed', 0, 'Random seed for sampling.')
  flags.DEFINE_string('mesh', None, 'DATA,FSDP,TENSOR device counts (-1 = the remaining '
                      'devices), e.g. 1,2,4: parameters sharded as in training (config.json\'s '
                      'mesh.rules), decoding tensor-parallel, same tokens. Default: one device.')
  flags.DEFINE_string('compilation_cache', '~/.cache/transformer_decode_xla',
                      'JAX persistent compilation cache directory (\'\' = none): repeated runs '
                      'with the same shapes start without compiling. Never inside --workdir.')


class DecodeError(Exception):
  """A user-facing error: printed as one line, no traceback."""


def _fail(message) -> None:
  print(f'decode.py: error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)
  sys.exit(2)


def _warn(message: str) -> None:
  print(f'decode.py: warning: {message}', file=sys.stderr, flush=True)


def _info(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- input, restore

def read_lines(path: str | None, what: str = 'input') -> list[str]:
  """UTF-8 lines of `path` (stdin when None; `.gz` files are decompressed) without their
  newlines. A line that is not valid UTF-8 is an error naming the file and line.
  """
  name = path or '<stdin>'
  try:
    if path is None:
      data = sys.stdin.buffer.read()
    else:
      with open(path, 'rb') as f:
        data = f.read()
    if path is not None and path.endswith('.gz'):
      data = gzip.decompress(data)
  except (OSError, EOFError) as e:
    reason = getattr(e, 'strerror', None) or e
    raise DecodeError(f'cannot read {what} file {name}: {reason}') from None
  raw = data.split(b'\n')
  if raw and raw[-1] == b'':
    raw.pop()
  lines = []
  for number, line in enumerate(raw, start=1):
    if line.endswith(b'\r'):
      line = line[:-1]
    try:
      lines.append(line.decode('utf-8'))
    except UnicodeDecodeError as e:
      raise DecodeError(f'{what} {name} line {number} is not valid UTF-8 (byte '
                        f'0x{line[e.start]:02x} at column {e.start + 1})') from None
  return lines


def restore(workdir: str, step: int | None, average_last: int, mesh=None):
  """`training.restore.Restored` of a workdir that holds a model with a decoder, with its
  parameters sharded over `mesh` (None: on one device)."""
  from model.kinds import kind_of  # pylint: disable=import-outside-toplevel
  from training import restore as restore_lib  # pylint: disable=import-outside-toplevel
  try:
    restored = restore_lib.Restored(workdir, step, average_last, mesh)
  except restore_lib.RestoreError as e:
    raise DecodeError(str(e)) from None
  if not kind_of(restored.module).has_decoder:
    raise DecodeError(f'{workdir} holds a {restored.kind} model: there is nothing to decode')
  averaged = f' (average of the last {average_last})' if average_last > 1 else ''
  where = '' if mesh is None else f' onto mesh (data, fsdp, tensor)={tuple(mesh.shape.values())}'
  _info(f'restored {restored.kind} step {restored.step}{averaged} from {workdir}{where} '
        f'in {restored.seconds:.1f}s')
  return restored


# ----------------------------------------------------------------------------- translate

def encode_sources(tokenizer, lines, max_source_len: int):
  """Token ids per line (EOS-terminated); empty lines -> None; long ones truncated (with a
  warning) by the rule of `model.inference.truncate`."""
  from model import inference  # pylint: disable=import-outside-toplevel
  sources = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      sources.append(None)
      continue
    ids = list(tokenizer.encode(line))
    if len(ids) > max_source_len:
      _warn(f'input line {number} has {len(ids)} tokens, more than the model\'s max_len '
            f'{max_source_len}; truncated')
    sources.append(inference.truncate(ids, max_source_len, tokenizer.eos_id))
  return sources


def translate(restored, sources, *, beam_size, alpha, max_len, batch_size, progress=True):
  """Output ids per source (None for empty), in order (`model.inference.Translator`: the
  trainer's BLEU evaluation decodes the same way)."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  from model import inference  # pylint: disable=import-outside-toplevel

  translator = inference.Translator(restored.module, restored.params, beam_size=beam_size,
                                    alpha=alpha, max_len=max_len, batch_size=batch_size,
                                    eos_id=restored.tokenizer.eos_id)
  count = sum(s is not None for s in sources)
  with tqdm(total=count, file=sys.stderr, unit='sent', desc='decoding', dynamic_ncols=True,
            disable=not progress or count <= batch_size) as bar:
    return translator(sources, progress=bar.update)


def score(hypotheses, references, lowercase_bleu=False) -> list[str]:
  """sacreBLEU BLEU (and lowercased BLEU) and chrF lines with their signatures."""
  from training import evaluation  # pylint: disable=import-outside-toplevel
  return evaluation.score_report(hypotheses, references, lowercase_bleu=lowercase_bleu)


def run_translation(restored, lines, references) -> None:
  dec = restored.config.decode
  beam_size = FLAGS.beam_size if FLAGS.beam_size is not None else dec.beam_size
  alpha = FLAGS.alpha if FLAGS.alpha is not None else dec.alpha
  max_len = FLAGS.max_len if FLAGS.max_len is not None else dec.max_len
  batch_size = FLAGS.batch_size if FLAGS.batch_size is not None else dec.get('batch_size', 64)
  model_max = restored.module.config.max_len
  if max_len > model_max:  # (the flags were checked up front, config.json by train.py)
    _warn(f'--max_len={max_len} is more than the model\'s max_len {model_max}; using {model_max}')
    max_len = model_max

  sources = encode_sources(restored.tokenizer, lines, model_max)
  started = time.time()
  outputs = translate(restored, sources, beam_size=beam_size, alpha=alpha, max_len=max_len,
                      batch_size=min(batch_size, max(1, sum(s is not None for s in sources))))
  elapsed = time.time() - started
  texts = ['' if o is None else restored.tokenizer.decode(o) for o in outputs]
  _write_lines(texts, FLAGS.output_file)
  n = sum(s is not None for s in sources)
  gen = sum(len(o) for o in outputs if o)
  search = f'beam {beam_size}, alpha {alpha}' if beam_size > 1 else 'greedy'
  _info(f'translated {n} sentence(s) ({search}) in {elapsed:.1f}s: '
        f'{n / max(elapsed, 1e-9):.1f} sentences/s, {gen / max(elapsed, 1e-9):.0f} tokens/s '
        f'(compilation included)')
  if references is not None:
    for line in score(texts, references, FLAGS.lowercase_bleu):
      _info(line)
  if FLAGS.attention_plot:
    written = _plot(restored, sources, outputs)
    more = ''
    if FLAGS.attention_plot_max and n > FLAGS.attention_plot_max:
      more = (f' (the first {FLAGS.attention_plot_max} sentences; --attention_plot_max=0 '
              'plots all)')
    _info(f'wrote {written} attention heatmaps to {FLAGS.attention_plot}{more}')


def _plot(restored, sources, outputs) -> int:
  from model import plotting  # pylint: disable=import-outside-toplevel
  return plotting.plot_sequences(
      restored.module, restored.params, lambda i: restored.tokenizer.id_to_piece(int(i)),
      sources, outputs, FLAGS.attention_plot, limit=FLAGS.attention_plot_max,
      heads=FLAGS.attention_plot_heads)


def _write_lines(texts, path) -> None:
  _write_text(''.join(t.replace('\n', ' ') + '\n' for t in texts), path)


def _write_text(body, path) -> None:
  """`body` to `path` (stdout when None)."""
  if path is None:
    sys.stdout.write(body)
    sys.stdout.flush()
    return
  try:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(body)
  except OSError as e:
    raise DecodeError(f'cannot write --output_file {path}: {e.strerror or e}') from None


# ----------------------------------------------------------------------------- language model

def run_language_model(restored, lines) -> None:
  from model import inference  # pylint: disable=import-outside-toplevel
  dec = restored.config.decode
  num_tokens = FLAGS.num_tokens if FLAGS.num_tokens is not None else dec.max_len
  temperature = FLAGS.temperature if FLAGS.temperature is not None else dec.get('temperature', 1.0)
  top_k = FLAGS.top_k if FLAGS.top_k is not None else dec.get('top_k', 0)
  top_p = FLAGS.top_p
  if temperature < 0:  # the flags are checked up front; these may come from config.json
    raise DecodeError(f'--temperature={temperature} must be >= 0')
  if top_k < 0:
    raise DecodeError(f'--top_k={top_k} must be >= 0')
  prompts = [FLAGS.prompt.replace('\\n', '\n')] if FLAGS.prompt is not None else lines
  tok = restored.tokenizer
  texts, plotted = [], []
  started = time.time()
  total = 0
  for number, prompt in enumerate(prompts, start=1):
    try:
      ids = list(tok.encode(prompt))
    except Exception as e:  # noqa: BLE001  # a character outside the vocabulary
      raise DecodeError(f'prompt {number}: {e}') from None
    if tok.eos_id is not None and ids and ids[-1] == tok.eos_id:
      ids = ids[:-1]  # continue the text, do not start after its end
    generated = inference.generate(
        restored.module, restored.params, ids, num_tokens=num_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=FLAGS.seed + number - 1, eos_id=tok.eos_id, warn=_warn)
    total += len(generated)
    texts.append(tok.decode(generated))
    plotted.append(ids + generated)
  elapsed = time.time() - started
  if FLAGS.prompt is not None:
    _write_text(FLAGS.prompt.replace('\\n', '\n') + texts[0] + '\n', FLAGS.output_file)
  else:
    _write_lines(texts, FLAGS.output_file)
  _info(f'generated {total} tokens for {len(prompts)} prompt(s) in {elapsed:.1f}s '
        f'({total / max(elapsed, 1e-9):.0f} tokens/s, compilation included)')
  if FLAGS.attention_plot:
    context = restored.module.config.max_len - 1
    sequences = [s[:context] for s in plotted]
    written = _plot(restored, [[] for _ in sequences], sequences)
    _info(f'wrote {written} attention heatmaps to {FLAGS.attention_plot}')


# ----------------------------------------------------------------------------- main

def _enable_compilation_cache() -> None:
  """JAX's persistent compilation cache: a second run with the same shapes skips compiling."""
  if not FLAGS.compilation_cache:
    return
  import jax  # pylint: disable=import-outside-toplevel
  try:
    path = os.path.expanduser(FLAGS.compilation_cache)
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  except Exception as e:  # noqa: BLE001  # a cache is only an optimisation
    _warn(f'no compilation cache ({e})')


def _check_flags():
  """Every numeric flag, the paths and the mesh, before anything is read, restored or written
  (NaN passes `< 0` tests: `--alpha=nan` would decode to empty lines) -> the --mesh or None."""
  for name in ('alpha', 'temperature'):
    value = getattr(FLAGS, name)
    if value is not None and not (math.isfinite(value) and value >= 0):
      raise DecodeError(f'--{name}={value} must be a finite number >= 0')
  if FLAGS.top_p is not None and not (math.isfinite(FLAGS.top_p) and 0 < FLAGS.top_p <= 1):
    raise DecodeError(f'--top_p={FLAGS.top_p} must be a finite number in (0, 1]')
  for name in ('average_last', 'beam_size', 'max_len', 'batch_size', 'num_tokens'):
    value = getattr(FLAGS, name)
    if value is not None and value < 1:
      raise DecodeError(f'--{name}={value} must be >= 1')
  if FLAGS.top_k is not None and FLAGS.top_k < 0:
    raise DecodeError(f'--top_k={FLAGS.top_k} must be >= 0')
  for name in ('input_file', 'reference'):
    path = getattr(FLAGS, name)
    if path is not None and not os.path.isfile(path):
      raise DecodeError(f'--{name} {path} does not exist')
    if _same_file(FLAGS.output_file, path):
      raise DecodeError(f'--output_file {FLAGS.output_file} is the same file as --{name} '
                        f'{path}: refusing to overwrite it')
  if FLAGS.mesh is None:
    return None
  from training import restore as restore_lib  # pylint: disable=import-outside-toplevel
  try:
    return restore_lib.mesh_from_flag(FLAGS.mesh)
  except restore_lib.RestoreError as e:
    raise DecodeError(str(e)) from None


def _same_file(a: str | None, b: str | None) -> bool:
  """The same file by path resolution (symlinks, `..`, hard links when both exist)."""
  if a is None or b is None:
    return False
  if os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)
  return os.path.realpath(a) == os.path.realpath(b)


def main(argv) -> None:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]} (flags are --name=value)')
  logging.set_verbosity(logging.ERROR)  # Orbax/JAX info lines would drown the output
  try:
    lm_flags = FLAGS.prompt is not None
    mesh = _check_flags()
    # Inputs first: a bad file fails before anything is restored or compiled.
    lines = read_lines(FLAGS.input_file) if not lm_flags else None
    references = read_lines(FLAGS.reference, 'reference') if FLAGS.reference else None
    if references is not None and not lm_flags and len(references) != len(lines):
      raise DecodeError(f'--reference {FLAGS.reference} has {len(references)} lines but the '
                        f'input {FLAGS.input_file or "<stdin>"} has {len(lines)}')
    restored = restore(FLAGS.workdir, FLAGS.step, FLAGS.average_last, mesh)
    with _matmul_precision(restored.config):
      _decode(restored, lines, references, lm_flags)
  except DecodeError as e:
    _fail(e)
  except KeyboardInterrupt:
    _fail('interrupted')


def _matmul_precision(config):
  """The run's `config.train.matmul_precision` (GPU/TPU float32 matmuls) for decoding too."""
  from training import accelerator  # pylint: disable=import-outside-toplevel
  name = config.get('train', {}).get('matmul_precision', 'default')
  try:
    return accelerator.matmul_precision(name)
  except ValueError as e:  # ConfigError: a hand-edited config.json
    raise DecodeError(str(e)) from None


def _decode(restored, lines, references, lm_flags) -> None:
  """Translation (a model with a source) or generation (a language model)."""
  from model.kinds import kind_of  # pylint: disable=import-outside-toplevel
  translates = kind_of(restored.module).has_source
  if translates and lm_flags:
    raise DecodeError(f'--prompt is for a language model, but {FLAGS.workdir} holds an '
                      f'{restored.kind} (translation) model: give sentences on stdin or '
                      '--input_file')
  if not translates and FLAGS.reference is not None:
    raise DecodeError(f'--reference is for translation, but {FLAGS.workdir} holds a '
                      f'{restored.kind} (language) model')
  _enable_compilation_cache()
  if translates:
    run_translation(restored, lines, references)
  else:
    run_language_model(restored, lines)


if __name__ == '__main__':
  _define_flags()
  app.run(main)
