"""What a GPU's modes allow a burst to do, read through NVML before each burst.

A burst takes a CUDA context on the GPU. Whether it may:
- compute mode EXCLUSIVE_PROCESS (or the deprecated EXCLUSIVE_THREAD): a
  context excludes every other process. A busy GPU refuses the burst's
  context, and a burst on an idle GPU holds the only context, so a job the
  scheduler starts in that second fails at its first CUDA call. The daemon
  runs no burst there at all; the scheduler's prolog/epilog runs
  `gpuwatchd canary` while it holds the GPU (docs/sdc.md).
- PROHIBITED: no context is allowed.
- MIG enabled: CUDA addresses MIG instances (`MIG-<uuid>`), not the parent
  GPU; the canaries do not check MIG GPUs, and say so.
- MPS clients running: the GPU is a job's, shared through MPS (in
  EXCLUSIVE_PROCESS, which MPS setups use, a burst cannot get a context at
  all); skipped like a GPU in an exclusive mode. The worker is never an MPS client: its
  CUDA_MPS_PIPE_DIRECTORY names an empty directory, so it is never queued
  behind another user's MPS server (runner.worker_environment).
- A busy GPU with less free memory than `min_free_bytes`: skipped, so the
  burst never crowds out the job's next allocation.

NVML's values: nvmlComputeMode_t and NVML_DEVICE_MIG_ENABLE in nvml.h
(NVIDIA/go-nvml, gen/nvml/nvml.h).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from gpuwatchd.canary.config import CanaryConfig

NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
NVML_DEVICE_MIG_ENABLE = 1

COMPUTE_MODES = {
    NVML_COMPUTEMODE_DEFAULT: "default",
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}
# Why a GPU gets no burst: the `reason` label of
# gpuwatchd_canary_gpu_skipped on /metrics.
SKIP_REASONS = (
    "no_backend",
    "exclusive_compute_mode",
    "compute_prohibited",
    "mig",
    "mps",
    "low_free_memory",
    "nvml",
)


@dataclass(frozen=True)
class GpuModes:
    compute_mode: str
    mig: bool
    mps_clients: int
    free_bytes: int | None
    # CUDA compute capability (major, minor): which mma canaries the GPU has
    # the instructions for; None when NVML cannot say.
    compute_capability: tuple[int, int] | None = None


# NVML index -> the GPU's modes now; raises pynvml.NVMLError when unreadable.
ModeReader = Callable[[int], GpuModes]


def read_modes(index: int) -> GpuModes:
    """The GPU's modes through NVML (initialised and shut down here:
    nvmlInit counts references, so the NVML source is not disturbed)."""
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mode = COMPUTE_MODES.get(pynvml.nvmlDeviceGetComputeMode(handle), "unknown")
        try:
            mig = pynvml.nvmlDeviceGetMigMode(handle)[0] == NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError_NotSupported:
            mig = False  # a GPU without MIG
        try:
            mps = len(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            mps = 0
        try:
            free: int | None = int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
        except pynvml.NVMLError_NotSupported:
            free = None
        return GpuModes(mode, mig, mps, free, _capability(handle))
    finally:
        pynvml.nvmlShutdown()


def _capability(handle: object) -> tuple[int, int] | None:
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except pynvml.NVMLError:
        return None
    return int(major), int(minor)


def compute_capability(index: int) -> tuple[int, int] | None:
    """The GPU's CUDA compute capability through NVML; None when NVML cannot say."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return _capability(pynvml.nvmlDeviceGetHandleByIndex(index))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


class NvmlCannotStart(RuntimeError):
    """NVML could not start; the message is its error."""


def nvml_gpus() -> list[tuple[int, str | None]]:
    """(NVML index, UUID) of the node's GPUs; NvmlCannotStart when NVML
    cannot start (no NVIDIA driver, or one it cannot talk to)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise NvmlCannotStart(str(error)) from error
    try:
        gpus: list[tuple[int, str | None]] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                gpus.append((index, str(pynvml.nvmlDeviceGetUUID(handle))))
            except pynvml.NVMLError:
                gpus.append((index, None))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def skip_reason(modes: GpuModes | None, idle: bool, config: CanaryConfig) -> str | None:
    """Why the GPU must get no burst now (one of SKIP_REASONS), or None.
    `modes` None: NVML could not say."""
    if modes is None:
        return "nvml"
    if modes.compute_mode in ("exclusive_process", "exclusive_thread", "unknown"):
        return "exclusive_compute_mode"
    if modes.compute_mode == "prohibited":
        return "compute_prohibited"
    if modes.mig:
        return "mig"
    if modes.mps_clients:
        return "mps"
    if not idle and modes.free_bytes is not None and modes.free_bytes < config.min_free_bytes:
        return "low_free_memory"
    return None
