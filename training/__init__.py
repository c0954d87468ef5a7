"""Training: train state, steps, mesh/sharding, optimizer, checkpoints, evaluation, logging.

  config_io     config.json in the workdir, validation, compatibility with an existing run
  mesh          the device mesh and the batch/parameter shardings
  optim         learning-rate schedules and the Optax optimizer
  state         the TrainState pytree and its creation
  steps         loss, train step, eval step (pure functions, jitted by the trainer)
  checkpoint    the one module over Orbax (Checkpointer, restore_params, list_steps)
  evaluation    validation loss/accuracy/perplexity and BLEU
  metrics       console lines and TensorBoard scalars (process 0 only)
  telemetry     MFU, step/compile time, peak device memory, profiler traces
  progress      the run's progress lines (train-step times only) and best figures across resumes
  accelerator   matmul precision and deterministic ops (GPU/TPU)
  trainer       the training loop (`train_and_evaluate`)
  report        `python -m training.report`: curves and a table of runs from their event files
"""
