"""What `decode.py` does with its flags: `run(FLAGS)`.

Every flag is checked before anything is read or restored: numbers against their ranges (in
the type they are used in: int32 / uint32 seeds, float32), paths, and then against the model
kind (from config.json, cheap) and the mode. A flag that does not apply (`--prompt` to a
translation model, `--temperature` to beam search, `--nbest` above the beam size, ...) is
refused with one line rather than ignored. Then: translate (a file in sorted full batches, a
stream line by line as it arrives), score references (forced decoding), or generate.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

from autoregressive import strategies
from common import atomic_file
from common.dtype_limits import INT32_MAX
from common.errors import carried
from common.files import inside
from workdir import cli

PROG = 'decode.py'
INT_LIMITS = {  # flag -> (lowest, highest); the decoding settings' are their fields'
    'step': (0, INT32_MAX), 'average_last': (1, cli.AVERAGE_LAST_MAX),
    'num_tokens': (1, strategies.NUM_TOKENS_MAX),
    'attention_plot_max': (0, INT32_MAX)}
SAMPLING_FLAGS = ('temperature', 'top_k', 'top_p')
# Flags of a translation model that a language model refuses (and the reverse).
TRANSLATION_FLAGS = ('reference', 'score_reference', 'strategy', 'beam_size', 'alpha',
                     'max_new_tokens', 'batch_size', 'nbest', 'lowercase_bleu')
LM_FLAGS = ('prompt', 'num_tokens')


def setting_flags() -> list[tuple[str, tuple]]:
  """decode.py's flags for the decoding settings, as (absl DEFINE function, its arguments):
  `--strategy` and one per field of `autoregressive.strategies` (its help; default
  config.decode's value where it has one)."""
  names = ', '.join(f'{name} ({row.HELP})' for name, row in strategies.TABLE.items())
  out = [('DEFINE_enum', ('strategy', None, list(strategies.TABLE),
                          f'Decoding strategy: {names}. Default: beam, or greedy at '
                          '--beam_size=1.'))]
  for name, (owner, field) in strategies.fields().items():
    in_config = field.metadata[strategies.base.IN_CONFIG]
    default = None if in_config else field.default
    where = f'; default config.decode.{name}' if in_config else ''
    of = '' if owner is strategies.Limits else f'{owner.NAME}: '
    help_text = f'{of}{field.metadata["doc"]}: {strategies.base.rule_of(field)}{where}.'
    define = 'DEFINE_integer' if field.type in ('int', int) else 'DEFINE_float'
    out.append((define, (name, default, help_text)))
  return out


class Plan(NamedTuple):
  mode: str  # 'translate' | 'score' | 'generate'
  settings: dict | None = None  # the decoding settings given as flags, and `strategy`


def _info(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _warn(message: str) -> None:
  print(f'{PROG}: warning: {message}', file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- flag checks

def check_numbers(F) -> None:
  for name, (lo, hi) in INT_LIMITS.items():
    cli.check_int(name, getattr(F, name), lo=lo, hi=hi)
  for name, (_, field) in strategies.fields().items():
    if getattr(F, name) is not None:
      try:
        strategies.check(field, getattr(F, name), f'--{name}')
      except ValueError as e:
        raise cli.UsageError(str(e)) from None


def _same_file(a: str | None, b: str | None) -> bool:
  """The same file by path resolution (symlinks, `..`, hard links when both exist)."""
  if a is None or b is None:
    return False
  if os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)
  return os.path.realpath(a) == os.path.realpath(b)


def check_paths(F) -> None:
  """Inputs exist and are not the output; outputs are nowhere the writer would refuse them
  (`common.atomic_file`: no symlink, FIFO, device, nor a workdir's own file), checked before
  anything is restored."""
  if F.output_file is not None and os.path.isdir(F.output_file):
    raise cli.UsageError(f'--output_file {F.output_file} is a directory')
  for name in ('input_file', 'reference', 'score_reference'):
    path = getattr(F, name)
    if path is None or (name == 'input_file' and path == '-'):
      continue
    if os.path.isdir(path):
      raise cli.UsageError(f'--{name} {path} is a directory')
    if not os.path.exists(path):
      raise cli.UsageError(f'--{name} {path} does not exist')
    if _same_file(F.output_file, path):
      raise cli.UsageError(f'--output_file {F.output_file} is the same file as --{name} '
                           f'{path}: refusing to overwrite it')
  try:
    if F.output_file is not None:
      atomic_file.check_destination(F.output_file, what='--output_file', workdirs=[F.workdir])
    if F.attention_plot is not None:
      atomic_file.check_output_dir(F.attention_plot, what='--attention_plot',
                                   workdirs=[F.workdir])
  except atomic_file.OutputError as e:
    raise cli.UsageError(str(e)) from None
  if F.compilation_cache and inside(os.path.expanduser(F.compilation_cache), F.workdir):
    raise cli.UsageError(f'--compilation_cache {F.compilation_cache} is inside --workdir '
                         f'{F.workdir}: decode.py never writes there (give another directory, '
                         "or '' for none)")


def _given(F, name: str) -> bool:
  """Whether the command line set `--name` (a bool flag: to true)."""
  value = getattr(F, name)
  return value is True if isinstance(value, bool) else F[name].present


def _refuse(F, names, message: str) -> None:
  """One line for the first of `names` given: `message` formatted with {flag}."""
  for name in names:
    if _given(F, name):
      raise cli.UsageError(message.format(flag=f'--{name}'))


def _settings(F, config, names, strategy: str | None, rename=None) -> dict:
  """The settings among `names` given as flags (and `strategy`), checked against the config
  and each other as the `Session` will (`rename`: a setting -> the flag giving it).
  A max_new_tokens beyond the model's positions is capped, as the session caps it."""
  rename = rename or {}
  flag_of = {name: rename.get(name, name) for name in names}
  given = {name: getattr(F, flag) for name, flag in flag_of.items() if _given(F, flag)}
  most, capped = strategies.fit_to_positions(
      given.get('max_new_tokens', config.decode.max_new_tokens), config.model.max_len)
  capped = capped and 'max_new_tokens' not in rename
  checked = dict(given, max_new_tokens=most) if capped else given

  def where(name):
    if name == 'max_new_tokens' and capped:
      return "the model's max_len"
    return f'--{flag_of.get(name, name)}'
  try:
    strategies.from_config(dict(config.decode), checked, strategy=strategy, where=where)
  except ValueError as e:
    raise cli.UsageError(str(e)) from None
  return dict(given, strategy=strategy)


def plan_translation(F, config, where: str) -> Plan:
  _refuse(F, LM_FLAGS, '{flag} is for a language model, but ' + where + ' holds an '
          'encoder_decoder (translation) model: give sentences on stdin or --input_file')
  if F.lowercase_bleu and F.reference is None:
    raise cli.UsageError('--lowercase_bleu needs --reference')
  settings = [name for name in strategies.fields() if name != 'batch_size']
  if F.score_reference is not None:
    _refuse(F, ('reference', 'strategy', *settings, 'attention_plot'),
            '{flag} does not apply to --score_reference (it scores the given references: '
            'nothing is searched)')
    return Plan('score')
  # At temperature 0 sampling is greedy: a top_k, top_p or seed given is refused there
  # (`Sampling.check_given`, the Session's rule too).
  return Plan('translate', _settings(F, config, strategies.fields(), F.strategy))


def plan_generation(F, config, where: str, kind: str) -> Plan:
  hint = {'max_new_tokens': ' (--num_tokens sets the length)'}
  for name in TRANSLATION_FLAGS:
    _refuse(F, (name,), '{flag} is for translation, but ' + where + f' holds a {kind} '
            f'(language) model{hint.get(name, "")}')
  if F.prompt is not None and F.input_file is not None:
    raise cli.UsageError('--prompt and --input_file both give prompts: use one')
  names = ('min_new_tokens', 'max_new_tokens', *SAMPLING_FLAGS, 'seed')
  settings = _settings(F, config, names, strategies.Sampling.NAME,
                       rename={'max_new_tokens': 'num_tokens'})
  return Plan('generate', settings)


def plan(F):
  """Checks every flag -> (Plan, mesh or None). Reads only config.json."""
  from model.kinds import adapter_of  # pylint: disable=import-outside-toplevel
  from workdir import restore as restore_lib  # pylint: disable=import-outside-toplevel
  check_numbers(F)
  check_paths(F)
  try:
    config, module = restore_lib.read_model(F.workdir)
    mesh = None if F.mesh is None else restore_lib.mesh_from_flag(F.mesh)
  except restore_lib.RestoreError as e:
    raise cli.UsageError(str(e)) from None
  adapter = adapter_of(module)
  if not adapter.has_decoder:
    raise cli.UsageError(f'{F.workdir} holds a {adapter.kind} model: there is nothing to decode')
  if F.attention_plot is None:
    _refuse(F, ('attention_plot_max', 'attention_plot_heads'), '{flag} needs --attention_plot')
  if adapter.has_source:
    return plan_translation(F, config, F.workdir), mesh
  return plan_generation(F, config, F.workdir, adapter.kind), mesh


# ----------------------------------------------------------------------------- run

def restore(workdir: str, step: int | None, average_last: int, mesh=None):
  """`inference.load(workdir, ...)` with one `restored ...` line on stderr."""
  import time  # pylint: disable=import-outside-toplevel

  from workdir import restore as restore_lib  # pylint: disable=import-outside-toplevel
  started = time.perf_counter()
  try:
    session = restore_lib.load(workdir, step=step, average_last=average_last, mesh=mesh,
                               warn=_warn)
  except (restore_lib.RestoreError, ValueError) as e:
    error = cli.UsageError(str(e))
    error.exit_code = getattr(e, 'exit_code', 2)  # 1: damaged files (a tokenizer checksum)
    raise error from None
  averaged = f' (average of the last {average_last})' if average_last > 1 else ''
  where = '' if mesh is None else f' onto mesh (data, fsdp, tensor)={tuple(mesh.shape.values())}'
  _info(f'restored {session.kind} step {session.step}{averaged} from {workdir}{where} '
        f'in {time.perf_counter() - started:.1f}s')
  return session


def _read(path: str | None, what: str) -> list[str]:
  from inference import streaming  # pylint: disable=import-outside-toplevel
  try:
    return streaming.read_lines(path, what)
  except streaming.InputError as e:
    raise cli.UsageError(str(e)) from None


def _inputs(F, the_plan: Plan):
  """(lines, references): the input read whole (None: a stream, read as it arrives), and the
  references (None without any). Read before anything is restored: a bad file fails first."""
  from inference import streaming  # pylint: disable=import-outside-toplevel
  if the_plan.mode == 'generate' and F.prompt is not None:
    return [F.prompt], None
  path = F.reference or F.score_reference
  stdin = F.input_file in (None, '-')
  if stdin and path is None and streaming.stdin_is_stream():
    if sys.stdin.isatty():
      _info('reading lines from the terminal, each translated when entered (Ctrl-D ends)')
    return None, None
  lines = _read(F.input_file, 'input')
  references = None if path is None else _read(path, 'reference')
  if references is not None and len(references) != len(lines):
    flag = '--reference' if F.reference else '--score_reference'
    raise cli.UsageError(f'{flag} {path} has {len(references)} lines but the input '
                         f'{F.input_file or "<stdin>"} has {len(lines)}')
  return lines, references


def run(F) -> None:
  """decode.py's whole run; a bad flag or input raises `cli.UsageError` (one line)."""
  from inference import streaming  # pylint: disable=import-outside-toplevel
  the_plan, mesh = plan(F)
  lines, references = _inputs(F, the_plan)
  session = restore(F.workdir, F.step, F.average_last, mesh)
  with _matmul_precision(session.config):
    from autoregressive import program_cache  # pylint: disable=import-outside-toplevel
    problem = program_cache.enable_compilation_cache(F.compilation_cache)
    if problem:  # a cache is only an optimisation
      _warn(f'no compilation cache ({problem})')
    try:
      if the_plan.mode == 'generate':
        from inference.decode_runs import generate  # pylint: disable=import-outside-toplevel
        generate(F, session, the_plan, lines)
      elif the_plan.mode == 'score':
        from inference.decode_runs import score  # pylint: disable=import-outside-toplevel
        score(F, session, lines, references)
      else:
        from inference.decode_runs import translate  # pylint: disable=import-outside-toplevel
        translate(F, session, the_plan, lines, references)
    except streaming.InputError as e:  # a stream's non-UTF-8 line, an unwritable output
      raise carried(cli.UsageError(str(e)), e) from None


def _matmul_precision(config):
  """The run's `config.train.matmul_precision` (GPU/TPU float32 matmuls) for decoding too."""
  from common import accelerator  # pylint: disable=import-outside-toplevel
  name = config.train.matmul_precision
  try:
    return accelerator.matmul_precision(name)
  except ValueError as e:  # ConfigError: a hand-edited config.json
    raise cli.UsageError(str(e)) from None


