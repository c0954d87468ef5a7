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
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import common.command_line  # noqa: F401  (first: a faster start, see its docstring)

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


def _config_error_message(error: BaseException, argv: list[str]) -> str:
  raw = str(error)
  if 'Traceback (most recent call last)' in raw:  # config_flags wraps the config file's error
    found = re.findall(r'^(\w+(?:Error|Exception)): (.*)$', raw, flags=re.M)
    if found:
      raw = f'{argv_config(argv)}: {found[-1][1]}'
  text = ' '.join(raw.replace('\\n', ' ').replace('\\', '').split())
  unknown = _unknown_overrides(argv)
  if unknown:
    return unknown
  return text


def _load_preset(argv: list[str]):
  """The config of the --config file and preset before any override, or None if it fails."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path, _, preset = argv_config(argv).partition(':')
  try:
    spec = importlib.util.spec_from_file_location('_train_config', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset) if preset else module.get_config()
  except Exception:  # pylint: disable=broad-except
    return None


def _unknown_overrides(argv: list[str]) -> str | None:
  """'unknown config field --config.x.y; did you mean ...' for the first override naming no
  field."""
  config = _load_preset(argv)
  if config is None:
    return None
  from common import schema as schema_lib  # pylint: disable=import-outside-toplevel
  for arg in argv:
    if not arg.startswith('--config.'):
      continue
    name = arg.split('=', 1)[0][len('--config.'):]
    node = config
    for i, key in enumerate(name.split('.')):
      keys = list(node.keys()) if hasattr(node, 'keys') else []
      if key not in keys:
        close = schema_lib.close_fields(name, schema_lib.leaf_paths(config))
        where = '.'.join(['config'] + name.split('.')[:i])
        hint = (f'; did you mean {" or ".join(close)}?' if close
                else f'; {where} has {sorted(keys)}')
        return f'unknown config field --config.{name}{hint}'
      node = node[key]
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with one-line errors (no traceback) for bad --config/--config.* flags."""
  from workdir import cli  # pylint: disable=import-outside-toplevel
  _define_flags()
  config_file = argv_config(argv).partition(':')[0]
  if not os.path.isfile(config_file):
    _fail(f'config file {config_file!r} not found (--config=configs/NAME.py[:preset])')
  try:
    config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'Config file[:preset].',
                                    lock_config=True)
    with cli.help_exits_zero(argv):
      remaining = FLAGS(argv)
    FLAGS.config.to_dict()  # loads the file and applies the overrides
  except flags.Error as e:
    _fail(_config_error_message(e, argv))
  except Exception as e:  # pylint: disable=broad-except
    _fail(_config_error_message(e, argv))
  if FLAGS.config is None:
    _fail('--config did not give a config')
  if not (FLAGS.workdir or FLAGS.show_config or FLAGS.config.train.get('dry_run', False)):
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
  if FLAGS.show_config:
    _show_config()
    return
  if FLAGS.config.train.get('deterministic', False) is True:
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
    if FLAGS.config.train.get('dry_run', False):
      _dry_run(FLAGS.config)
      return
    preset = _load_preset(sys.argv)  # for the run's first line: the preset and what differs
    trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                               preset=None if preset is None else (_config_name(), preset),
                               on_second_interrupt=_interrupted_now,
                               overridden=frozenset(config_flags.get_override_values(
                                   FLAGS['config'])))
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


def _show_config() -> None:
  """--show_config: the resolved config as a table (configs/show.py), then the checks that
  need no devices, so that a config the run would refuse is said so too. No workdir is read."""
  from common.errors import ConfigError  # pylint: disable=import-outside-toplevel
  from configs import schema, show  # pylint: disable=import-outside-toplevel
  preset = _load_preset(sys.argv)
  overrides = config_flags.get_override_values(FLAGS['config'])
  print(show.table(FLAGS.config, FLAGS.config if preset is None else preset, set(overrides),
                   _config_name()), flush=True)
  try:
    schema.check_across(schema.validate_sections(FLAGS.config))
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
