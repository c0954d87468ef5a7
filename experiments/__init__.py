"""Experiments: a sweep is rows of config overrides x seeds, each run an ordinary train.py
workdir, trained and evaluated the same way, and a table that says which differences are real.

    python sweep.py --sweep=configs/sweeps/norm_position.py --root=runs/norm_position

Modules:
  sweep_file    `load` a sweep file (configs/sweeps/: `Sweep`), `plan`: its runs, checked
  launch        states, time estimates, submitit (local subprocesses or a SLURM job array)
  job           one run's job: train.py, then the evaluation
  evaluate      the evaluation every run gets: BLEU/chrF on validation and test, or LM loss
  significance  paired bootstrap over test sentences (sacreBLEU's), Welch's t over seeds
  table         ROOT/summary.md and ROOT/curves.png
  archive       `python -m experiments.archive save|restore`: evaluated runs without their
                checkpoints, kept and put back (a sweep longer than one machine's lease)
  report        `python -m experiments.report`: curves and a table of any runs, from their
                TensorBoard event files
"""
