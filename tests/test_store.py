"""State database: quarantines that survive restarts and SIGKILL, the journal,
boots and their XIDs, samples across a restart, and databases that cannot be used."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_history import T0, gpu, link, record

from gpuwatchd.checks import aer, memory, nvlink
from gpuwatchd.history import History
from gpuwatchd.model import (
    Finding,
    Health,
    PcieFunctionSample,
    PortSample,
    Reading,
    Severity,
    XidEvent,
)
from gpuwatchd.policy import PolicyConfig, PolicyState, evaluate
from gpuwatchd.store import StateConflict, Store, StoreError, read_boot_id
from gpuwatchd.store.schema import SCHEMA_VERSION

SUBJECTS = ("node", "gpu:0", "gpu:1", "gpu:2", "gpu:3")


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")


@pytest.fixture
def store(state_dir: str) -> Iterator[Store]:
    opened = Store.open(state_dir)
    yield opened
    opened.close()


def remap_failure(subject: str = "gpu:1") -> Finding:
    return Finding(
        subject,
        "memory",
        "row_remap_failure",
        Severity.CRITICAL,
        "row remapping failed",
        definitive=True,
    )


def poll(
    store: Store,
    findings: list[Finding],
    now: float,
    readings: tuple[Reading, ...] = (),
    boot_id: str | None = None,
) -> PolicyState:
    """What the daemon does each poll: load, evaluate, save."""
    result = evaluate(findings, store.load_state(), now, PolicyConfig(), SUBJECTS)
    return store.save_poll(result, now=now, boot_id=boot_id, readings=readings)


def test_a_new_database_is_in_wal_mode_at_the_current_schema(store: Store, state_dir: str) -> None:
    with sqlite3.connect(os.path.join(state_dir, "state.db")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.persistent


def test_a_hardware_quarantine_survives_restarts_and_is_never_auto_released(
    state_dir: str,
) -> None:
    first = Store.open(state_dir)
    poll(first, [remap_failure()], T0)
    first.close()
    # A month later, quiet all along, across two restarts.
    for days in (1, 30):
        reopened = Store.open(state_dir)
        state = poll(reopened, [], T0 + days * 86400)
        quarantine = state.quarantine("gpu:1")
        assert quarantine is not None and quarantine.hardware
        reopened.close()
    final = Store.open(state_dir)
    assert [q.subject for q in final.quarantines()] == ["gpu:1", "node"]
    final.close()


def test_manual_quarantine_and_release_are_journaled_with_their_operator(store: Store) -> None:
    decision = store.quarantine("gpu:2", "bad fan", "alice", T0)
    assert (decision.kind, decision.source) == ("quarantine", "manual")
    [quarantine] = store.quarantines()
    assert (quarantine.subject, quarantine.operator, quarantine.reason) == (
        "gpu:2",
        "alice",
        "bad fan",
    )
    released = store.release("gpu:2", "bob", T0 + 60, "fan replaced")
    assert released is not None and released.reason == "fan replaced"
    assert store.quarantines() == ()
    assert store.release("gpu:2", "bob", T0 + 61) is None
    entries = store.journal.entries(subject="gpu:2")
    assert [(e.kind, e.operator, e.message) for e in entries] == [
        ("quarantine", "alice", "bad fan"),
        ("health_changed", "alice", "new -> quarantined"),
        ("release", "bob", "fan replaced"),
        ("health_changed", "bob", "quarantined -> degraded"),
    ]


def test_an_invalid_subject_is_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(ValueError, match="not a subject"):
        store.quarantine("gpu3", "typo", "alice", T0)
    assert store.journal.entries() == ()


def test_a_manual_quarantine_outlives_the_daemon_policy(store: Store) -> None:
    store.quarantine("gpu:0", "maintenance", "alice", T0)
    state = poll(store, [], T0 + 90 * 86400)
    assert state.quarantine("gpu:0") is not None
    assert store.load_state().subject("gpu:0") is not None


def test_the_journal_is_queryable_by_time_and_subject(store: Store) -> None:
    poll(store, [remap_failure("gpu:3")], T0)
    poll(store, [], T0 + 10)
    store.quarantine("gpu:0", "maintenance", "alice", T0 + 20)
    gpu3 = store.journal.entries(subject="gpu:3")
    assert [(e.kind, e.code) for e in gpu3] == [
        ("finding_raised", "row_remap_failure"),
        ("health_changed", None),
        ("quarantine", "row_remap_failure"),
        ("finding_cleared", "row_remap_failure"),
    ]
    assert gpu3[0].data == {
        "action": "none",
        "definitive": True,
        "immediate": False,
        "evidence": {},
    }
    assert [e.kind for e in store.journal.entries(since=T0 + 15)] == [
        "quarantine",
        "health_changed",
    ]
    assert [e.subject for e in store.journal.entries(since=T0 + 15)] == ["gpu:0", "gpu:0"]
    assert "gpu:0" not in {e.subject for e in store.journal.entries(until=T0 + 15)}
    assert len(store.journal.entries(until=T0 + 15)) == len(store.journal.entries()) - 2
    assert len(store.journal.entries(limit=2)) == 2


def test_a_poll_evaluated_before_a_manual_change_cannot_overwrite_it(state_dir: str) -> None:
    daemon = Store.open(state_dir)
    cli = Store.open(state_dir)
    result = evaluate([], daemon.load_state(), T0, PolicyConfig(), SUBJECTS)
    cli.quarantine("gpu:1", "suspect", "alice", T0 + 1)
    journal_before = daemon.journal.entries()
    with pytest.raises(StateConflict):
        daemon.save_poll(result, now=T0 + 2)
    assert daemon.journal.entries() == journal_before
    # The daemon reloads and evaluates again; the manual quarantine stands.
    state = poll(daemon, [], T0 + 3)
    assert state.quarantine("gpu:1") is not None
    daemon.close()
    cli.close()


def test_boots_are_kept_in_order_with_the_xids_of_each(store: Store) -> None:
    xid = Reading("nvml", T0, gpus=(gpu(2),), xid_events=(XidEvent(2, 48, T0, "GPU-0002"),))
    store.boots.add("boot-a", T0)
    poll(store, [], T0, (xid,), boot_id="boot-a")
    poll(store, [], T0 + 1, (xid,), boot_id="boot-a")
    store.boots.add("boot-b", T0 + 100)
    store.boots.add("boot-c", T0 + 200)
    poll(store, [], T0 + 201, (xid,), boot_id="boot-c")
    record = store.boots.record()
    assert record.boot_ids == ("boot-a", "boot-b", "boot-c")
    assert {(x.boot_id, x.gpu, x.uuid, x.code, x.last_time) for x in record.xids} == {
        ("boot-a", 2, "GPU-0002", 48, T0),
        ("boot-c", 2, "GPU-0002", 48, T0),
    }
    assert record.reboots_since_first("GPU-0002", 48, since=T0) == 2
    # XIDs last seen before the escalation window are not counted.
    assert record.reboots_since_first("GPU-0002", 48, since=T0 + 1) == 0
    assert store.boots.record(boots=2).boot_ids == ("boot-b", "boot-c")


def test_a_daemon_restart_within_one_boot_keeps_it_current(store: Store) -> None:
    store.boots.add("boot-a", T0)
    store.boots.add("boot-b", T0 + 100)
    store.boots.add("boot-b", T0 + 500)
    assert store.boots.record().boot_ids == ("boot-a", "boot-b")


def test_the_boot_id_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text("4f0c1d9e-0000-4000-8000-000000000001\n")
    assert read_boot_id(str(path)) == "4f0c1d9e-0000-4000-8000-000000000001"


def test_saved_samples_come_back_as_readings_equal_to_what_was_read(store: Store) -> None:
    sample = gpu(
        0,
        temperature_gpu_celsius=61.0,
        throttle_seconds={"thermal": 12.5},
        ecc_errors={("uncorrected", "volatile"): 1, ("corrected", "aggregate"): 7},
        retired_pages={"double_bit": 2},
        nvlinks=(link(0, 0, crc_flit=5), link(0, 1, up=False)),
        xid_counts={79: 1, 13: 4},
    )
    port = PortSample("mlx5_0", 1, state="ACTIVE", counters={"symbol_error": 3})
    poll(store, [], T0, (Reading("nvml", T0, gpus=(sample,)), Reading("ib", T0, ports=(port,))))
    [reading] = store.samples.readings(T0 + 60, max_age=3600)
    assert reading.time == T0
    assert reading.gpus == (sample,)
    assert reading.ports == (port,)
    assert store.samples.readings(T0 + 7200, max_age=3600) == ()


def test_each_poll_saves_its_own_links_and_subjects_when_the_last_polls_are_reused(
    store: Store,
) -> None:
    # The sources and policy hand over the last poll's objects where nothing
    # changed; the store writes those without encoding them again, and what
    # changed as it is now.
    links = (link(0, 0, crc_flit=5), link(0, 1))
    first = gpu(0, temperature_gpu_celsius=60.0, nvlinks=links)
    poll(store, [], T0, (Reading("nvml", T0, gpus=(first,)),))
    again = gpu(0, temperature_gpu_celsius=61.0, nvlinks=links)
    poll(store, [], T0 + 10, (Reading("nvml", T0 + 10, gpus=(again,)),))
    assert store.samples.gpu("GPU-0000") == (T0 + 10, again)
    moved = gpu(0, temperature_gpu_celsius=61.0, nvlinks=(link(0, 0, crc_flit=6), link(0, 1)))
    state = poll(
        store, [remap_failure("gpu:0")], T0 + 20, (Reading("nvml", T0 + 20, gpus=(moved,)),)
    )
    assert store.samples.gpu("GPU-0000") == (T0 + 20, moved)
    assert store.load_state().subjects == state.subjects
    tracked = store.load_state().subject("gpu:0")
    assert tracked is not None and tracked.findings
    # The same subjects once more (a quiet poll keeps them), then cleared.
    poll(store, [remap_failure("gpu:0")], T0 + 30)
    state = poll(store, [], T0 + 40)
    assert store.load_state().subjects == state.subjects


def test_each_poll_saves_its_pcie_functions_and_xid_counts_as_they_are_now(store: Store) -> None:
    # Equal samples are written without encoding them again; one that changed,
    # even to an equal value of another type, is written as it is now.
    def function(fatal: object) -> PcieFunctionSample:
        errors = {"correctable": 2, "nonfatal": 0, "fatal": fatal}
        return PcieFunctionSample("0000:18:00.0", "gpu", aer_errors=errors, link_width=16)

    def saved() -> tuple[object, object]:
        with sqlite3.connect(store.path) as db:
            rows = dict(db.execute("SELECT subject, data FROM last_samples").fetchall())
        return json.loads(rows["pcie:0000:18:00.0"]), json.loads(rows["GPU-0000"])["xid_counts"]

    counts = {79: 1}
    polls = [
        (function(0), counts),
        (function(0), counts),
        (function(1), {79: 2}),
        (function(True), {}),
    ]
    for seconds, (sample, xid_counts) in enumerate(polls):
        now = T0 + 10 * seconds
        readings = (
            Reading("pcie", now, pcie_functions=(sample,)),
            Reading("nvml", now, gpus=(gpu(0, xid_counts=xid_counts),)),
        )
        poll(store, [], now, readings)
        pcie, xids = saved()
        assert pcie["aer_errors"] == dict(sample.aer_errors)
        assert type(pcie["aer_errors"]["fatal"]) is type(sample.aer_errors["fatal"])
        assert xids == [[code, n] for code, n in xid_counts.items()]


def test_rates_are_right_across_a_restart(state_dir: str) -> None:
    before = gpu(
        0,
        ecc_errors={("uncorrected", "volatile"): 0},
        nvlinks=(link(0, 3, up=True),),
    )
    first = Store.open(state_dir)
    poll(first, [], T0, (Reading("nvml", T0, gpus=(before,)),))
    first.close()
    # Down for five minutes; meanwhile a DBE happened and link 3 went down.
    after = gpu(0, ecc_errors={("uncorrected", "volatile"): 1}, nvlinks=(link(0, 3, up=False),))
    restarted = Store.open(state_dir)
    now = T0 + 300
    history = History(max_age_seconds=3600)
    for reading in restarted.samples.readings(now, max_age=3600):
        history.record(reading)
    record(history, now, [after])
    restarted.close()
    assert [f.code for f in memory.run(history, now, memory.MemoryConfig()).findings] == [
        "ecc_uncorrectable"
    ]
    assert [f.code for f in nvlink.run(history, now, nvlink.NvlinkConfig()).findings] == [
        "nvlink_down"
    ]
    # Without the saved baseline the same poll shows neither.
    fresh = record(History(max_age_seconds=3600), now, [after])
    assert memory.run(fresh, now, memory.MemoryConfig()).findings == ()
    assert nvlink.run(fresh, now, nvlink.NvlinkConfig()).findings == ()


def test_a_corrupt_database_file_is_reported_clearly(state_dir: str) -> None:
    os.makedirs(state_dir)
    Path(state_dir, "state.db").write_bytes(b"this is not sqlite\n" * 500)
    with pytest.raises(StoreError, match="not a readable sqlite database") as raised:
        Store.open(state_dir)
    assert raised.value.path == os.path.join(state_dir, "state.db")
    assert "move it aside" in str(raised.value)


def test_a_damaged_page_in_a_real_database_is_reported_clearly(state_dir: str) -> None:
    store = Store.open(state_dir)
    for number in range(300):
        store.quarantine(f"gpu:{number}", "x" * 200, "alice", T0 + number)
    store.close()
    with open(os.path.join(state_dir, "state.db"), "r+b") as handle:
        handle.seek(3 * 4096)
        handle.write(b"\xff" * 4 * 4096)
    with pytest.raises(StoreError, match=r"malformed|damaged"):
        Store.open(state_dir)


def test_a_database_from_a_newer_gpuwatchd_is_refused(state_dir: str) -> None:
    Store.open(state_dir).close()
    with sqlite3.connect(os.path.join(state_dir, "state.db")) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer"):
        Store.open(state_dir)


def test_a_state_directory_that_cannot_be_made_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot create the state directory"):
        Store.open(str(blocker / "state"))


def test_a_database_path_that_cannot_be_opened_is_reported(state_dir: str) -> None:
    os.makedirs(os.path.join(state_dir, "state.db"))
    with pytest.raises(StoreError, match="cannot be written"):
        Store.open(state_dir)


def test_an_in_memory_store_keeps_policy_working_but_says_it_does_not_persist() -> None:
    store = Store.in_memory()
    assert not store.persistent
    state = poll(store, [remap_failure()], T0)
    assert state.quarantine("gpu:1") is not None
    tracked = store.load_state().subject("gpu:1")
    assert tracked is not None and tracked.health is Health.QUARANTINED
    store.close()


# A child that quarantines subject after subject, each in its own transaction,
# with a poll's worth of journal and samples in between, and says on stdout
# which quarantine it has committed. It holds the database as the daemon does
# (exclusive: its WAL index only in its memory, lost with it).
WRITER = textwrap.dedent(
    """
    import sys
    from gpuwatchd.model import Finding, GpuSample, Reading, Severity
    from gpuwatchd.policy import PolicyConfig, evaluate
    from gpuwatchd.store import Store

    store = Store.open(sys.argv[1], exclusive=True)
    number = int(sys.argv[2])
    while True:
        store.quarantine(f"gpu:{number}", "kill test", "tester", float(number))
        print(number, flush=True)
        finding = Finding(f"gpu:{number}", "memory", "ecc_sbe_storm", Severity.WARN, "storm")
        result = evaluate([finding], store.load_state(), float(number), PolicyConfig())
        reading = Reading("nvml", float(number), gpus=(GpuSample(index=number, up=True),))
        store.save_poll(result, now=float(number), boot_id="boot", readings=(reading,))
        number += 1
    """
)


def test_sigkill_at_any_moment_loses_no_committed_quarantine(state_dir: str) -> None:
    Store.open(state_dir).close()
    chooser = random.Random(20260101)
    committed: set[int] = set()
    for _ in range(20):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, state_dir, str(max(committed, default=-1) + 1)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        for _ in range(chooser.randint(1, 25)):
            committed.add(int(child.stdout.readline()))
        child.send_signal(signal.SIGKILL)
        committed.update(int(line) for line in child.stdout.read().split())
        child.wait()
        assert child.returncode == -signal.SIGKILL
        store = Store.open(state_dir)
        quarantined = {
            int(q.subject.removeprefix("gpu:"))
            for q in store.quarantines()
            if q.subject.startswith("gpu:")
        }
        store.close()
        assert committed <= quarantined
    with sqlite3.connect(os.path.join(state_dir, "state.db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert len(committed) >= 20


def test_facts_learned_about_the_node_are_kept_per_key_across_a_reopen(state_dir: str) -> None:
    store = Store.open(state_dir)
    store.facts.put("infiniband_ports_seen_active", ["ib:mlx5_0/1"], now=10.0)
    store.facts.put("infiniband_ports_seen_active", ["ib:mlx5_0/1", "ib:mlx5_1/1"], now=20.0)
    store.close()
    reopened = Store.open(state_dir)
    assert reopened.facts.get("infiniband_ports_seen_active") == ["ib:mlx5_0/1", "ib:mlx5_1/1"]
    assert reopened.facts.get("gpus_at_healthy_start") is None
    reopened.close()


def test_a_fatal_aer_error_while_the_daemon_was_down_shows_after_the_restart(
    state_dir: str,
) -> None:
    def function(fatal: int) -> PcieFunctionSample:
        errors = {"correctable": 2, "nonfatal": 0, "fatal": fatal}
        return PcieFunctionSample("0000:18:00.0", "gpu", aer_errors=errors, aer_causes={})

    first = Store.open(state_dir)
    poll(first, [], T0, (Reading("pcie", T0, pcie_functions=(function(0),)),))
    first.close()
    restarted = Store.open(state_dir)
    now = T0 + 300
    history = History(max_age_seconds=3600)
    for reading in restarted.samples.readings(now, max_age=3600):
        history.record(reading)
    restarted.close()
    history.record(Reading("pcie", now, pcie_functions=(function(1),)))
    findings = aer.run(history, now, aer.AerConfig()).findings
    assert [(f.subject, f.code) for f in findings] == [("node", "aer_fatal_errors")]
