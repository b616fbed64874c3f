"""The checks' paths for inputs that did not change give what judging them
afresh gives: a source that hands back the same objects where nothing
changed (as the NVML source does with a GPU's links), or counters that stood
still while others moved, change no finding and no measurement."""

from __future__ import annotations

from gpu_history import gpu, last_time, link, record, timeline

from gpuwatchd.checks import infiniband, nvlink, thermal
from gpuwatchd.checks.infiniband import InfinibandCheckConfig
from gpuwatchd.checks.nvlink import NvlinkConfig
from gpuwatchd.checks.thermal import ThermalConfig
from gpuwatchd.history import History
from gpuwatchd.model import (
    BYTES_PER_GIGABIT,
    FABRIC_STATE_COMPLETED,
    GpuSample,
    LinkSample,
    PortSample,
    Reading,
)

H100 = "NVIDIA H100 80GB HBM3"
POLLS = 40


def _links(k: int) -> tuple[LinkSample, ...]:
    """Poll k's links of GPU 2: link 3 never up, link 5 down from poll 25, the
    others up; link 7's replay counter grows once, at poll 30."""
    return tuple(
        link(2, n, up=n != 3 and not (n == 5 and k >= 25), replay=int(n == 7 and k >= 30))
        for n in range(18)
    )


def _board(links: tuple[LinkSample, ...]) -> GpuSample:
    return gpu(2, name=H100, fabric_state=FABRIC_STATE_COMPLETED, nvlinks=links)


def test_links_handed_back_as_the_same_tuple_are_judged_as_equal_copies() -> None:
    # The NVML source gives a sample the last one's links where none changed:
    # the check judges a run of such samples once, and must find what it
    # finds in samples that each carry a copy of their own.
    shared: list[tuple[LinkSample, ...]] = []
    for k in range(POLLS):
        links = _links(k)
        shared.append(shared[-1] if shared and shared[-1] == links else links)
    assert len({id(links) for links in shared}) == 3
    config = NvlinkConfig()
    same, copies = History(max_age_seconds=7200.0), History(max_age_seconds=7200.0)
    judged_same, judged_copies = [], []
    for k in range(POLLS):
        time = last_time(k + 1)
        record(same, time, [_board(shared[k])])
        record(copies, time, [_board(_links(k))])
        judged_same.append(nvlink.run(same, time, config))
        judged_copies.append(nvlink.run(copies, time, config))
    assert judged_same == judged_copies
    codes = [{(f.subject, f.code) for f in output.findings} for output in judged_same]
    assert [("nvlink:2/5", "nvlink_down") in found for found in codes] == [
        k >= 25 for k in range(POLLS)
    ]
    assert ("nvlink:2/7", "nvlink_replay_errors") in codes[30]
    assert ("nvlink:2/7", "nvlink_replay_errors") not in codes[-1]
    # Link 3 never came up: missing on the GPU once a whole window is seen.
    assert all(("gpu:2", "nvlink_missing") in found for found in codes[6:])


def _throttled(k: int) -> GpuSample:
    """Power throttling every poll; thermal throttling only from poll 30 to
    poll 34, after a long stretch in which every reason but power stood still."""
    seconds = {
        "power": 0.25 * k,
        "thermal": 5.0 * min(max(k - 30, 0), 4),
        "sync_boost": 0.0,
        "hw_thermal_slowdown": 0.0,
    }
    return gpu(0, throttle_seconds=seconds, temperature_gpu_celsius=60.0)


def test_a_steady_reason_that_moves_while_power_moves_every_poll_is_judged_each_poll() -> None:
    # The reasons that stand still on a healthy board share one change mark:
    # thermal starting to move after it must be judged at once, and measured
    # as a history made afresh measures it, poll after poll, while it ages out.
    config = ThermalConfig(window=60.0)
    history = History(max_age_seconds=7200.0)
    each_poll, fresh = [], []
    for k in range(POLLS + 10):
        time = last_time(k + 1)
        record(history, time, [_throttled(k)])
        each_poll.append(thermal.run(history, time, config))
        fresh.append(thermal.run(timeline(k + 1, lambda n, t: [_throttled(n)]), time, config))
    assert each_poll == fresh
    throttled = ["thermal_throttling" in {f.code for f in output.findings} for output in each_poll]
    # 5 s a poll from poll 31 to 34; 10 % of the 60 s window is 6 s, which the
    # window (six polls back) holds from poll 32 and last holds at poll 38.
    assert throttled == [32 <= k <= 38 for k in range(POLLS + 10)]
    shares = {m.labels["reason"]: m.value for m in each_poll[-1].measurements if m.labels["reason"]}
    assert shares["thermal"] == shares["sync_boost"] == shares["hw_thermal_slowdown"] == 0.0
    assert shares["power"] > 0


def _port(k: int) -> PortSample:
    """mlx5_0 port 1 at poll k, ACTIVE/LinkUp with traffic moving its data
    counters: 400 Gb/s, retrained to 200 Gb/s at poll 20 with every other
    field still; link_downed counts one flap at poll 25."""
    counters = {name: 0 for name in infiniband.QUIET_COUNTERS}
    counters.update(
        link_downed=int(k >= 25),
        port_xmit_wait=1000 * k,
        port_rcv_packets=10**9 * k,
        port_rcv_data=10**12 * k,
    )
    return PortSample(
        device="mlx5_0",
        port=1,
        state_id=infiniband.ACTIVE,
        state="ACTIVE",
        physical_state_id=infiniband.LINK_UP,
        physical_state="LinkUp",
        rate_bytes_per_second=(400 if k < 20 else 200) * BYTES_PER_GIGABIT,
        counters=counters,
    )


def _ports(history: History, k: int) -> History:
    history.record(Reading(source="infiniband", time=last_time(k + 1), ports=(_port(k),)))
    return history


def test_a_port_retrained_with_its_counters_still_is_judged_each_poll_as_afresh() -> None:
    # The rate is one of the quiet fields whose one mark spares a healthy port
    # the mark of its state and rate: a retrain with nothing else moving is
    # still seen, poll after poll, and so is a flap while in its window.
    config = InfinibandCheckConfig(flap_window=60.0)
    history = History(max_age_seconds=7200.0)
    each_poll, fresh = [], []
    for k in range(POLLS):
        time = last_time(k + 1)
        each_poll.append(infiniband.run(_ports(history, k), time, config))
        afresh = History(max_age_seconds=7200.0)
        for n in range(k + 1):
            _ports(afresh, n)
        fresh.append(infiniband.run(afresh, time, config))
    assert each_poll == fresh
    codes = [{f.code for f in output.findings} for output in each_poll]
    assert ["ib_port_rate_degraded" in found for found in codes] == [k >= 20 for k in range(POLLS)]
    # The flap of poll 25 counts until poll 31, whose 60 s window opens at the
    # last sample before it (poll 24's).
    assert ["ib_link_flapping" in found for found in codes] == [25 <= k <= 31 for k in range(POLLS)]
