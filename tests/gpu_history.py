"""Builders for the GPU check, policy and store tests: samples with explicit
times, recorded into a History the way the daemon records polls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuwatchd.history import History
from gpuwatchd.model import GpuSample, LinkSample, Reading, XidEvent

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
POLL = 10.0


def gpu(index: int = 0, **fields: Any) -> GpuSample:
    """A GPU that answers, with its UUID, and whatever else the test sets."""
    fields.setdefault("uuid", f"GPU-{index:04d}")
    fields.setdefault("up", True)
    return GpuSample(index=index, **fields)


def link(gpu_index: int, number: int, up: bool | None = True, **errors: int) -> LinkSample:
    return LinkSample(gpu=gpu_index, link=number, up=up, errors=errors)


def record(
    history: History, time: float, gpus: Sequence[GpuSample], xids: Sequence[XidEvent] = ()
) -> History:
    history.record(Reading(source="nvml", time=time, gpus=tuple(gpus), xid_events=tuple(xids)))
    return history


def timeline(
    polls: int,
    gpus_at: Callable[[int, float], Sequence[GpuSample]],
    start: float = T0,
    step: float = POLL,
    history: History | None = None,
) -> History:
    """`polls` polls, `step` apart from `start`; poll k reads `gpus_at(k, time)`."""
    history = history or History(max_age_seconds=7200.0)
    for k in range(polls):
        time = start + k * step
        record(history, time, gpus_at(k, time))
    return history


def last_time(polls: int, start: float = T0, step: float = POLL) -> float:
    return start + (polls - 1) * step
