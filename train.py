"""Train, evaluate and checkpoint a Transformer: `python train.py --workdir=DIR [--config=...]`.

  python train.py --workdir=/tmp/run                                    # configs/default.py
  python train.py --config=configs/default.py:tiny --workdir=/tmp/tiny  # a preset
  python train.py --config=configs/shakespeare_char.py --workdir=/tmp/lm \\
      --config.train.num_steps=500 --config.model.dtype=bfloat16        # overrides

Every --config.SECTION.FIELD, with its value, origin and doc: `python train.py --show_config`.
Starting again on the same DIR resumes from its newest checkpoint. Multi-host: pass
`--jax_distributed` (with `--coordinator_address`, `--num_processes`, `--process_id`, or the
environment variables / cluster auto-detection that `jax.distributed.initialize` reads).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NamedTuple

from absl import app, flags, logging
from ml_collections import config_flags

import common.command_line  # noqa: F401  (first: a faster start, see its docstring)
from common.errors import ConfigError

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'default.py')
FLAGS = flags.FLAGS


def _define_flags() -> None:
  # absl.app.run defines --help, --helpfull (...) before its own parsing; train.py parses
  # first (one-line errors), so it defines them itself (idempotent; again where a test's
  # harness removed the flags a previous parse defined).
  app.define_help_flags()
  for flag in (app.HelpFlag(), app.HelpshortFlag(), app.HelpfullFlag(), app.HelpXMLFlag()):
    if flag.name not in FLAGS:
      flags.DEFINE_flag(flag)
  flags.DEFINE_string('workdir', None, 'Directory for config.json, checkpoints, TensorBoard '
                      'events and the tokenizer; training resumes from it.')
  flags.DEFINE_bool('jax_distributed', False, 'Call jax.distributed.initialize() (multi-host).')
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (multi-host; '
                      'default $JAX_COORDINATOR_ADDRESS or cluster auto-detection).')
  flags.DEFINE_integer('num_processes', None, 'Number of processes (default $JAX_NUM_PROCESSES '
                       'or cluster auto-detection).')
  flags.DEFINE_integer('process_id', None, 'This process id (default $JAX_PROCESS_ID or cluster '
                       'auto-detection).')
  flags.DEFINE_string('cpu_collectives', 'gloo', 'CPU collectives for multi-process CPU runs '
                      "('gloo' | 'mpi' | 'none').")
  flags.DEFINE_bool('show_config', False, 'Print the resolved config (each field with its '
                    'value, origin and doc) and exit; --workdir is not needed.')


def argv_config(argv: list[str]) -> str:
  values = [a.split('=', 1)[1] for a in argv if a.startswith('--config=')]
  return values[-1] if values else DEFAULT_CONFIG


def _fail(message: str, code: int = 2) -> None:
  from workdir import cli  # pylint: disable=import-outside-toplevel
  cli.fail('train.py', message, code=code)


class Resolved(NamedTuple):
  """What `parse_flags` resolved (configs.resolve): the config the run trains with, each
  field's origin, and the preset before the command line's overrides."""
  config: Any
  origins: dict[str, str]
  preset: Any


RESOLVED: Resolved | None = None  # set by parse_flags


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with one-line errors (no traceback) for bad --config/--config.* flags;
  the config is `configs.resolve`'s (in RESOLVED), config_flags only reads the overrides' text
  into values."""
  global RESOLVED  # pylint: disable=global-statement
  from configs import resolve  # pylint: disable=import-outside-toplevel
  from workdir import cli  # pylint: disable=import-outside-toplevel
  _define_flags()
  spec = argv_config(argv)
  fields = [a.split('=', 1)[0][len('--config.'):] for a in argv if a.startswith('--config.')]
  try:  # the preset, and the fields the overrides name, before config_flags reads their text
    preset = resolve.load(spec)
    resolve.check_fields(preset, fields)
  except resolve.UnknownField as e:
    _fail(f'unknown config field --config.{e.field}{e.hint}')
  except ConfigError as e:
    _fail(e)
  try:
    config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'Config file[:preset].',
                                    lock_config=True)
    with cli.help_exits_zero(argv):
      remaining = FLAGS(argv)
    overrides = config_flags.get_override_values(FLAGS['config'])
  except Exception as e:  # pylint: disable=broad-except  (absl/config_flags raise many types)
    _fail(resolve.flag_error_text(e))
  try:  # checked by the trainer, once config.train.init_from has filled the model section
    config, origins = resolve.resolve(preset, overrides, validate=False)
  except ConfigError as e:
    _fail(e)
  config.lock()  # a typo'd field set in code is an error, as on the command line
  RESOLVED = Resolved(config, origins, preset)
  if not (FLAGS.workdir or FLAGS.show_config or config.train.get('dry_run', False)):
    _fail('--workdir is required')
  try:  # int flags that become C ints in jax.distributed (the config's: config_io's checks)
    cli.check_int('num_processes', FLAGS.num_processes, lo=1)
    most = (FLAGS.num_processes or cli.INT32_MAX) - 1
    cli.check_int('process_id', FLAGS.process_id, lo=0, hi=most)
  except cli.UsageError as e:
    _fail(e)
  return remaining


def _init_distributed() -> None:
  import jax  # pylint: disable=import-outside-toplevel
  if FLAGS.cpu_collectives != 'none':
    jax.config.update('jax_cpu_collectives_implementation', FLAGS.cpu_collectives)
  env = {'coordinator_address': os.environ.get('JAX_COORDINATOR_ADDRESS'),
         'num_processes': os.environ.get('JAX_NUM_PROCESSES'),
         'process_id': os.environ.get('JAX_PROCESS_ID')}
  kwargs = {}
  for name, value in env.items():
    value = getattr(FLAGS, name) if getattr(FLAGS, name) is not None else value
    if value is not None:
      kwargs[name] = value if name == 'coordinator_address' else int(value)
  jax.distributed.initialize(**kwargs)


def main(argv: list[str]) -> None:
  if not FLAGS['verbosity'].present:  # absl/JAX/Orbax INFO logs off unless --verbosity=0
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}')
  config, origins, preset = RESOLVED
  if FLAGS.show_config:
    _show_config(config, origins)
    return
  if config.train.get('deterministic', False) is True:
    from common import accelerator  # pylint: disable=import-outside-toplevel
    accelerator.request_deterministic_ops()  # XLA reads it when the backend starts
  if (FLAGS.jax_distributed or FLAGS.coordinator_address
      or os.environ.get('JAX_COORDINATOR_ADDRESS')):
    _init_distributed()
  # Imported after jax.distributed.initialize (which must precede any other JAX call).
  from model.config import ConfigError  # pylint: disable=import-outside-toplevel
  from training import trainer  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  user_errors = (ConfigError, checkpoint.CheckpointError, *_data_errors())
  try:
    if config.train.get('dry_run', False):
      _dry_run(config)
      return
    trainer.train_and_evaluate(config, FLAGS.workdir, preset=(_config_name(), preset),
                               on_second_interrupt=_interrupted_now,
                               overridden=frozenset(field for field, origin in origins.items()
                                                    if origin == 'override'))
  except checkpoint.CheckpointWriteError as e:  # ran, then failed to save
    print(f'train.py: error: {" ".join(str(e).split())}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # not sys.exit: Orbax's threads of the failed save may wait minutes, then log
  except trainer.NonFiniteLossError as e:  # ran, then failed
    _fail(e, code=1)
  except user_errors as e:  # bad config/workdir/checkpoint/data: one line, no traceback
    _fail(e, code=getattr(e, 'exit_code', 2))  # 1: damaged files (a tokenizer checksum)
  except KeyboardInterrupt:  # a second Ctrl-C (the first saves and stops), or one in the setup
    _interrupted(checkpoint.list_steps(FLAGS.workdir) if FLAGS.workdir else [])


def _config_name() -> str:
  name = argv_config(sys.argv)
  return 'configs/default.py' if name == DEFAULT_CONFIG else name


def _show_config(config, origins) -> None:
  """--show_config: the resolved config as a table (configs/show.py), then the checks that
  need no devices, so that a config the run would refuse is said so too. No workdir is read."""
  from configs import resolve, show  # pylint: disable=import-outside-toplevel
  print(show.table(config, origins, _config_name()), flush=True)
  try:
    resolve.check(config)
  except ConfigError as e:
    _fail(e)


def _interrupted_now() -> None:
  """A second Ctrl-C, from the signal handler: exits here rather than through a
  KeyboardInterrupt, which is lost when the signal lands in a gc callback."""
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  _interrupted(checkpoint.list_steps(FLAGS.workdir))


def _interrupted(steps: list[int]) -> None:
  """One line and exit status 130 at once: no waiting for background writes (a checkpoint
  being written is left unfinished, and removed by the next run), no traceback."""
  where = (f'{FLAGS.workdir} resumes from checkpoint {steps[-1]}' if steps else
           f'{FLAGS.workdir} has no checkpoint yet')
  print(f'train.py: error: interrupted: stopped at once; {where}', file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(130)  # pylint: disable=protected-access


def _dry_run(config) -> None:
  """Prints the parameter count and the compiled train step's per-device memory."""
  from training import memory  # pylint: disable=import-outside-toplevel
  report = memory.dry_run(config)
  print(f'{report["parameters"]:,} parameters; train step compiled in {report["compile_s"]:.1f}s',
        flush=True)
  print(memory.format_table(report['memory'], report['mesh']), flush=True)


def _data_errors() -> tuple[type[BaseException], ...]:
  try:
    from input_pipeline.errors import DataError  # pylint: disable=import-outside-toplevel
    return (DataError,)
  except ImportError:
    return ()


if __name__ == '__main__':
  from common import interrupts
  # A Ctrl-C (or SIGTERM) during the start-up raised KeyboardInterrupt where Python drops it
  # (JAX's gc callback): the run then trained to the end. Remembered, it stops the run before
  # its first step (the trainer checks).
  interrupts.stop_on_signals()
  _remaining = parse_flags(sys.argv)
  app.run(main, argv=_remaining, flags_parser=lambda argv: argv)
