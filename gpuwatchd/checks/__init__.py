"""Checks: pure functions from History to findings, one module per concern."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatchd.model import Finding, Measurement


@dataclass(frozen=True)
class CheckOutput:
    """What one check says about the node at one time."""

    findings: tuple[Finding, ...] = ()
    measurements: tuple[Measurement, ...] = ()
