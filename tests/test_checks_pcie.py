"""PCIe check: a busy GPU whose link trained below its maximum, and replay storms
judged against DCGM's expected replay rate."""

from __future__ import annotations

import pytest
from gpu_history import gpu, last_time, timeline

from gpuwatchd.checks import pcie
from gpuwatchd.checks.pcie import PcieConfig, allowed_replays_per_minute
from gpuwatchd.model import Action, GpuSample, Severity

CONFIG = PcieConfig()


def link(
    generation: int = 5, width: int = 16, utilization: float = 0.95, replays: int = 0
) -> GpuSample:
    return gpu(
        0,
        pcie_link_generation=generation,
        pcie_link_max_generation=5,
        pcie_link_width=width,
        pcie_link_max_width=16,
        utilization_gpu_ratio=utilization,
        pcie_replays=replays,
    )


def codes(polls: int, sample_at: object) -> list[tuple[str, Severity]]:
    history = timeline(polls, lambda k, t: [sample_at(k)])  # type: ignore[operator]
    output = pcie.run(history, last_time(polls), CONFIG)
    return [(f.code, f.severity) for f in output.findings]


def test_busy_gpu_at_full_link_raises_nothing() -> None:
    assert codes(120, lambda k: link()) == []


def test_idle_gpu_at_gen1_is_power_saving_not_downtraining() -> None:
    assert codes(120, lambda k: link(generation=1, utilization=0.0)) == []


def test_busy_gpu_on_x8_warns_then_is_critical_after_fifteen_busy_windows() -> None:
    assert codes(12, lambda k: link(width=8)) == [("pcie_downtrained", Severity.WARN)]
    history = timeline(91, lambda k, t: [link(width=8)])
    (finding,) = pcie.run(history, last_time(91), CONFIG).findings
    assert (finding.code, finding.severity, finding.definitive) == (
        "pcie_downtrained",
        Severity.CRITICAL,
        False,
    )
    assert finding.action is Action.INSPECT_HARDWARE
    assert finding.evidence["width"] == 8 and finding.evidence["max_width"] == 16


def test_busy_gpu_at_gen4_below_its_gen5_maximum_is_downtrained() -> None:
    assert codes(12, lambda k: link(generation=4)) == [("pcie_downtrained", Severity.WARN)]


def test_an_idle_window_holds_back_the_critical_finding() -> None:
    # Downtrained whenever busy, but idle for over a minute of the quarter hour:
    # that window judges nothing, so the link has not held for 15 busy windows.
    def sample(k: int) -> GpuSample:
        return link(width=8, utilization=0.0 if 30 <= k < 40 else 0.95)

    assert codes(91, sample) == [("pcie_downtrained", Severity.WARN)]


def test_a_link_back_at_full_width_clears_the_finding() -> None:
    assert codes(30, lambda k: link(width=8 if k < 20 else 16)) == []


def test_unknown_link_values_are_not_evidence() -> None:
    unknown = gpu(0, utilization_gpu_ratio=1.0, pcie_link_width=8)
    assert codes(30, lambda k: unknown) == []


@pytest.mark.parametrize(
    ("generation", "width", "allowed"),
    [(5, 16, 31), (4, 16, 16), (3, 16, 8), (5, 8, 16), (6, 16, 62), (7, 16, 62)],
)
def test_allowed_replays_follow_dcgm_expected_rate(
    generation: int, width: int, allowed: int
) -> None:
    assert allowed_replays_per_minute(generation, width, 1e-12) == allowed


def test_replays_over_the_expected_rate_warn_a_replay_storm() -> None:
    # 10 replays a poll, 60 a minute, over the 31 a Gen5 x16 link may show.
    found = codes(12, lambda k: link(replays=10 * k))
    assert found == [("pcie_replay_storm", Severity.WARN)]


def test_replays_within_the_expected_rate_raise_nothing() -> None:
    # 5 a poll: 30 a minute, within 31.
    assert codes(12, lambda k: link(replays=5 * k)) == []


def test_replay_rate_is_measured() -> None:
    history = timeline(12, lambda k, t: [link(replays=10 * k)])
    (measurement,) = pcie.run(history, last_time(12), CONFIG).measurements
    assert measurement.name == "gpu_pcie_replays_per_minute"
    assert measurement.value == pytest.approx(60.0)
