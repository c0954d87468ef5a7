"""Run an experiment: the rows of a sweep file x its seeds, each an ordinary train.py workdir,
evaluated the same way, then a table with mean ± sd and a significance verdict per row.

  python sweep.py --sweep=configs/sweeps/norm_position.py --root=runs/norm_position
  python sweep.py --sweep=... --root=... --dry_run          # the plan, what is done, the time
  python sweep.py --sweep=... --root=... --report           # only the table, from what is done
  python sweep.py --sweep=... --root=... --executor=slurm --slurm_partition=gpu --parallel=8

Running it again skips the finished runs, resumes the unfinished ones from their checkpoints
and (with --retry_failed) reruns the failed ones. Each run is ROOT/ROW/seed_S; the table is
ROOT/summary.md and ROOT/curves.png. How to write a sweep file: experiments/sweep_file.py and
docs/guide.md ("Experiments").
"""

from __future__ import annotations

import os
import shlex
import sys

from absl import app, flags

import common.command_line  # noqa: F401  (first: a faster start, see its docstring)

PROG = 'sweep.py'
FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('sweep', None, 'The sweep file (configs/sweeps/NAME.py).')
  flags.DEFINE_string('root', None, 'Where the runs go (ROOT/ROW/seed_S); default runs/NAME.')
  flags.DEFINE_bool('dry_run', False, 'Print the plan (runs, which are done, estimated time) '
                    'and exit; nothing is written.')
  flags.DEFINE_bool('report', False, 'Write the table (ROOT/summary.md, curves.png) from the '
                    'finished runs and exit; nothing is trained.')
  flags.DEFINE_enum('executor', 'auto', ['auto', 'local', 'slurm'], 'auto: SLURM where srun '
                    'exists, else local subprocesses (submitit\'s choice).')
  flags.DEFINE_integer('parallel', 1, 'Runs at once (local), or the SLURM array\'s bound.')
  flags.DEFINE_bool('retry_failed', False, 'Rerun the runs whose last attempt failed.')
  flags.DEFINE_list('only', [], 'Run only these runs: ROW/seed_S or ROW names, fnmatch '
                    'patterns allowed (e.g. modern/seed_2, "*/seed_0"); the table still '
                    'shows every run done.')
  flags.DEFINE_string('slurm_partition', None, 'SLURM partition (default: the sweep file\'s).')
  flags.DEFINE_integer('slurm_time_min', None, 'SLURM time limit per run, in minutes.')
  flags.DEFINE_integer('slurm_gpus_per_node', None, 'GPUs per SLURM job.')
  flags.DEFINE_integer('slurm_cpus_per_task', None, 'CPUs per SLURM job.')
  flags.DEFINE_integer('slurm_mem_gb', None, 'Memory per SLURM job, in GiB.')


def _fail(message, code: int = 2) -> None:
  from workdir import cli  # pylint: disable=import-outside-toplevel
  cli.fail(PROG, message, code=code)


def main(argv: list[str]) -> None:
  from common import interrupts  # pylint: disable=import-outside-toplevel
  from common.errors import exit_code  # pylint: disable=import-outside-toplevel
  from common.files import file_in_the_way  # pylint: disable=import-outside-toplevel
  from experiments import launch, sweep_file  # pylint: disable=import-outside-toplevel
  # Ctrl-C and SIGTERM (a time limit, systemd, a batch system) stop the sweep alike: each run
  # saves a checkpoint and stops, and the last line is the command that resumes; also when a
  # shell started it in the background (SIGINT arrives ignored), and when the KeyboardInterrupt
  # lands where Python drops it (JAX's gc callback, while the plan is checked): remembered, it
  # stops the sweep at the next `interrupts.check()`.
  interrupts.stop_on_signals()
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}')
  if not FLAGS.sweep:
    _fail('--sweep=configs/sweeps/NAME.py is required')
  if FLAGS.parallel < 1:
    _fail(f'--parallel={FLAGS.parallel} must be at least 1')
  if FLAGS.dry_run and FLAGS.report:
    _fail('--dry_run and --report: choose one')
  name = os.path.splitext(os.path.basename(FLAGS.sweep))[0]
  # Resolved once, here: train.py runs in the repository, the jobs and the table wherever.
  root = os.path.abspath(FLAGS.root or os.path.join('runs', name))
  slurm = {'partition': FLAGS.slurm_partition, 'time_min': FLAGS.slurm_time_min,
           'gpus_per_node': FLAGS.slurm_gpus_per_node, 'cpus_per_task': FLAGS.slurm_cpus_per_task,
           'mem_gb': FLAGS.slurm_mem_gb}
  try:
    plan = sweep_file.plan(sweep_file.load(FLAGS.sweep), root, FLAGS.sweep)
    blocker = file_in_the_way(root)
    if blocker is not None:
      where = 'is not a directory' if blocker == root else f'lies below {blocker}, a file'
      raise sweep_file.SweepError(f'--root={root} {where}')
    if FLAGS.report and not os.path.exists(root):  # a typo: no empty table in a new folder
      raise sweep_file.SweepError(f'--root={root} does not exist: no run of this sweep to '
                                  'report')
    launch.slurm_fields(plan, slurm)  # checked whichever the executor: type, range, characters
    interrupts.check()
    if FLAGS.dry_run or FLAGS.report:  # the same refusals as a run's: another sweep's root
      launch.check_manifest(plan, write=False)
      for line in launch.ignored(plan):
        print(f'{PROG}: warning: {line}', file=sys.stderr, flush=True)
    if FLAGS.dry_run:
      interrupts.check()
      lines = launch.describe(plan, FLAGS.parallel, FLAGS.only)  # may refuse --only
      print(f'sweep {FLAGS.sweep} -> {root}: {len(plan.runs)} runs', flush=True)
      print('\n'.join(lines), flush=True)
      return
    if FLAGS.report:
      from experiments import table  # pylint: disable=import-outside-toplevel
      written = table.write(plan)
      print(written['table'], end='', flush=True)
      print(f'wrote {written["summary"]}' + (f' and {written["curves"]}'
                                              if written['curves'] else ''), flush=True)
      return
    resume = ' '.join(shlex.quote(a) for a in ['python', *sys.argv])
    code = launch.run(plan, executor=FLAGS.executor, parallel=FLAGS.parallel,
                      retry_failed=FLAGS.retry_failed, slurm=slurm,
                      out=lambda line: print(line, flush=True), resume_command=resume,
                      only=FLAGS.only)
  except sweep_file.SweepError as e:
    _fail(e, code=exit_code(e))
  except OSError as e:  # a full disk under a file no message names yet: one line, exit 1
    where = f' ({e.filename})' if e.filename else ''
    _fail(f'{e.strerror or e}{where}', code=exit_code(e))
  except KeyboardInterrupt:  # planning, --dry_run or --report (a run says it itself)
    _fail('interrupted; no run was started', code=130)
  sys.stdout.flush()
  sys.exit(code)


if __name__ == '__main__':
  _define_flags()
  from workdir import cli  # noqa: E402  pylint: disable=wrong-import-position
  app.run(main, flags_parser=cli.absl_flags_parser(PROG))
