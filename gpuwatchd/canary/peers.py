"""Which of a node's canary targets can vouch for each other.

A sibling's passing re-run clears a canary's inputs, reference and software
only when the sibling computes that canary as the suspect does; and a canary
failing on most of a node's GPUs is a software fault only when they all
compute it alike. Both hold within one model and SM count: cuBLAS promises
bitwise-identical results only on "GPUs with the same architecture and the
same number of SMs" (cuBLAS guide, "Results reproducibility"), and a
problem of one model (an accumulator narrower on one generation, a driver
bug of one architecture) fails every GPU of that model alike. So on a node
that mixes models a GPU's peers are the GPUs of its own model, and the
host's cores are one group of their own.

Pure: reads the GPUs' samples (the model NVML names) and the SM counts
their canary backends reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwatchd.canary.confirm import Peers
from gpuwatchd.model import GpuSample

HOST_CORES = "host cores"
# The group of GPUs whose name NVML did not give.
UNKNOWN_MODEL = "unknown model"


def peer_groups(
    targets: Sequence[str], gpus: Mapping[int, GpuSample], sm_counts: Mapping[str, int]
) -> Peers:
    """Each of `targets` (`gpu:<index>` of `gpus`, `cpu:<core>`) with its peer
    group. `sm_counts`: GPU UUID -> the SM count its backend reported. A
    model is split by SM count only once every one of its GPUs reported
    one: until its first bursts are back, the model alone groups it."""
    models = {t: _model(gpus, t) for t in targets if t.startswith("gpu:")}
    counts = {t: _sm_count(gpus, sm_counts, t) for t in models}
    unsplit = {models[t] for t, count in counts.items() if count is None}
    groups = {t: HOST_CORES for t in targets if t not in models}
    for target, model in models.items():
        groups[target] = model if model in unsplit else f"{model}, {counts[target]} SMs"
    return groups


def _sample(gpus: Mapping[int, GpuSample], target: str) -> GpuSample | None:
    return gpus.get(int(target.split(":")[1]))


def _model(gpus: Mapping[int, GpuSample], target: str) -> str:
    sample = _sample(gpus, target)
    return (sample.name if sample else None) or UNKNOWN_MODEL


def _sm_count(
    gpus: Mapping[int, GpuSample], sm_counts: Mapping[str, int], target: str
) -> int | None:
    sample = _sample(gpus, target)
    uuid = sample.uuid if sample else None
    return sm_counts.get(uuid) if uuid else None
