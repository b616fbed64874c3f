"""What the canaries did since the daemon started: an immutable aggregate of
results, built burst by burst, that the exporter renders; and the targets
under doubt now (leads awaiting their re-runs, watches), that status shows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gpuwatchd.canary.confirm import Lead, Watch
from gpuwatchd.canary.result import CanaryResult


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class CanaryStats:
    # (target, canary, outcome) -> runs since start.
    runs: Mapping[tuple[str, str, str], int] = field(default_factory=_empty)
    # (target, canary) -> bits flipped in mismatching outputs since start.
    mismatched_bits: Mapping[tuple[str, str], int] = field(default_factory=_empty)
    # Target -> when its last burst (or re-run) in which every canary passed ended.
    last_pass: Mapping[str, float] = field(default_factory=_empty)
    # (target, canary) -> its latest result.
    latest: Mapping[tuple[str, str], CanaryResult] = field(default_factory=_empty)
    # GPU index -> (why no canary runs on it now, since when): the agent
    # sets it every poll.
    unchecked: Mapping[int, tuple[str, float]] = field(default_factory=_empty)
    # (target, canary) pairs that will run: exported at zero from the first
    # poll, so that even a first burst's mismatch is an increase from 0.
    planned: frozenset[tuple[str, str]] = frozenset()
    # Target -> its lead under confirmation (a mismatch re-run on it and a
    # sibling), and target -> its watch (an unconfirmed mismatch, watched
    # with more frequent bursts): the agent sets both every poll.
    suspects: Mapping[str, Lead] = field(default_factory=_empty)
    watches: Mapping[str, Watch] = field(default_factory=_empty)

    def plan(self, pairs: Iterable[tuple[str, str]]) -> CanaryStats:
        """These stats with `pairs` exported from now on, at zero until they run."""
        planned = self.planned | frozenset(pairs)
        return self if planned == self.planned else replace(self, planned=planned)

    def add(self, burst: Sequence[CanaryResult]) -> CanaryStats:
        """These stats with one burst's results counted in."""
        runs = dict(self.runs)
        bits = dict(self.mismatched_bits)
        latest = dict(self.latest)
        last_pass = dict(self.last_pass)
        for result in burst:
            key = (result.target, result.canary)
            runs[(*key, result.result)] = runs.get((*key, result.result), 0) + 1
            bits[key] = bits.get(key, 0) + result.mismatched_bits
            latest[key] = result
        for target in {result.target for result in burst}:
            mine = [result for result in burst if result.target == target]
            times = [result.time for result in mine if result.time is not None]
            if times and all(result.result == "pass" for result in mine):
                last_pass[target] = max(times)
        return replace(
            self,
            runs=MappingProxyType(runs),
            mismatched_bits=MappingProxyType(bits),
            last_pass=MappingProxyType(last_pass),
            latest=MappingProxyType(latest),
        )
