"""Training: the loop and what only it needs. Only train.py imports it (and bench/'s training
benchmarks, and import.py's train state: hf_import); the workdir it writes is `workdir`'s.

  config_check  a run's config: every field, the rules across sections and devices, and
                compatibility with the run already in its workdir
  mesh          the device mesh of config.mesh and the batch/parameter shardings
  optim         learning-rate schedules and the Optax optimizer
  state         the TrainState pytree and its creation
  steps         loss, train step, eval step (pure functions, jitted by the trainer)
  losses        label-smoothed cross-entropy and accuracy (a fused gradient)
  evaluation    validation loss/accuracy/perplexity
  init_from     a fine-tune's starting parameters (config.train.init_from)
  metrics       console lines and TensorBoard scalars (process 0 only)
  telemetry     MFU, step/compile time, peak device memory, profiler traces
  progress      the run's progress lines (train-step times only) and best figures across resumes
  memory        per-device bytes of the state on a mesh (the dry run's table)
  trainer       the training loop (`train_and_evaluate`)
"""
