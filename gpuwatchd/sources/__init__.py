"""Sources: one per hardware interface. A source turns what the hardware says
into model objects and knows nothing about health."""

from __future__ import annotations

from typing import Protocol

from gpuwatchd.model import Reading


class SourceUnavailable(RuntimeError):
    """The source cannot run on this machine at all (no NVML library, say)."""


class Source(Protocol):
    name: str

    def poll(self, now: float) -> Reading:
        """One reading. Never raises for a value or device it cannot read."""
        ...

    def close(self) -> None: ...
