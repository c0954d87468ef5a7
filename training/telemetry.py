"""What a run reports about the hardware: MFU, step and compile time, peak device memory, and
profiler traces of chosen steps.

`CompileTimer` measures the time JAX spends compiling (tracing, lowering, XLA) inside a block,
from JAX's own monitoring events, so that an evaluation can say how much of it was the first
beam search's compilation.

MFU is the model's analytic train FLOPs per second (matmuls only, 2 FLOPs per multiply-add,
backward = 2 x forward, as `bench/train_step.py` counts them) over the devices' dense peak
from `PEAK_TFLOPS`. Devices not in the table (CPUs) get no MFU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import jax
import jax.monitoring

from configs.schema import parse_profile_steps
from model.kinds import adapter_of

# Dense peak TFLOP/s per chip (vendor data sheets, no sparsity): bf16 compute, and float32
# at the backend's default precision (TF32 tensor cores on NVIDIA; bf16 passes on TPU).
# First match wins, so the more specific names come first.
PEAK_TFLOPS: Sequence[tuple[str, float, float]] = (
    (r'H100.*PCIe', 756.0, 378.0),
    (r'H100|H200|GH200', 989.4, 494.7),
    (r'A100', 312.0, 156.0),
    (r'\bL4\b', 121.0, 60.0),
    (r'TPU v4', 275.0, 275.0),
    (r'TPU v5 ?(lite|e)', 197.0, 197.0),
    (r'TPU v5', 459.0, 459.0),
    (r'TPU v6', 918.0, 918.0),
)


def peak_flops(device_kind: str, dtype: str) -> float | None:
  """Dense peak FLOP/s of one device of `device_kind` for compute `dtype`, or None if unknown."""
  for pattern, bf16, f32 in PEAK_TFLOPS:
    if re.search(pattern, device_kind):
      return 1e12 * (bf16 if dtype == 'bfloat16' else f32)
  return None


def train_step_flops(model_config, batch_shapes: Mapping[str, Sequence[int]]) -> int:
  """Analytic FLOPs of one train step for a batch with these `[batch, len]` shapes (padding
  included: it is computed): 3 x the forward pass's matmuls (`ModelAdapter.forward_flops`)."""
  return 3 * adapter_of(model_config).forward_flops(model_config, batch_shapes)


def mfu(flops_per_step: float, seconds_per_step: float, dtype: str,
        devices: Sequence[jax.Device] | None = None) -> float | None:
  """Model FLOPs utilisation of `devices` (default: all), or None on devices with no known peak."""
  devices = jax.devices() if devices is None else devices
  peak = peak_flops(devices[0].device_kind, dtype)
  if peak is None or seconds_per_step <= 0:
    return None
  return flops_per_step / seconds_per_step / (peak * len(devices))


class CompileTimer:
  """`with CompileTimer() as timer: ...` -> `timer.seconds` spent compiling inside the block.

  Sums the wall time covered by JAX's `/jax/core/compile/*` event spans (tracing, lowering to
  MLIR, XLA compilation or a persistent-cache read), counting overlapping spans once.
  """

  PREFIX = '/jax/core/compile/'

  def __init__(self):
    self.seconds = 0.0
    self._spans: list[tuple[float, float]] = []

  def _on_span(self, event: str, start: float, end: float, **kwargs) -> None:
    del kwargs
    if event.startswith(self.PREFIX):
      self._spans.append((start, end))

  def __enter__(self) -> CompileTimer:
    self._spans = []
    jax.monitoring.register_event_time_span_listener(self._on_span)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_time_span_listener(self._on_span)
    total, reach = 0.0, float('-inf')
    for start, end in sorted(self._spans):
      if end > reach:
        total += end - max(start, reach)
        reach = end
    self.seconds = total


def peak_memory_bytes() -> int | None:
  """Peak bytes in use on the busiest local device since start, where the backend reports it
  (GPU, TPU); None on CPU."""
  peaks = []
  for device in jax.local_devices():
    try:
      stats = device.memory_stats()
    except Exception:  # pylint: disable=broad-except  (backends without the call)
      stats = None
    if stats and 'peak_bytes_in_use' in stats:
      peaks.append(int(stats['peak_bytes_in_use']))
  return max(peaks) if peaks else None


class StepProfiler:
  """A JAX profiler trace of steps START..END (inclusive) into DIR/profile, readable with
  TensorBoard's profile plugin or XProf. Steps are numbered as in the log (step k ends with
  the state at step k)."""

  def __init__(self, profile_steps: str, workdir: str):
    self.steps = parse_profile_steps(profile_steps)
    self.log_dir = os.path.join(workdir, 'profile')
    self.active = False

  def before_step(self, step: int) -> None:
    """Call before running step `step`."""
    if self.steps and step == self.steps[0] and not self.active:
      jax.profiler.start_trace(self.log_dir)
      self.active = True

  def after_step(self, step: int, outputs) -> bool:
    """Call after dispatching step `step`; waits for `outputs` and stops the trace after END.
    Returns True when a trace was written."""
    if not self.active or step < self.steps[1]:
      return False
    jax.block_until_ready(outputs)
    self.stop()
    return True

  def stop(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
