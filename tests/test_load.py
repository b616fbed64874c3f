"""Load and endurance: 200 concurrent clients on /metrics and the API are
all answered, and so are 1000 writes from 50 writers; a long run at a short
interval keeps memory, descriptors, threads and the database flat; the
journal is pruned to its retention. (Latencies are measured by
bench/bench_listener.py, not asserted here.)"""

from __future__ import annotations

import gc
import os
import resource
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from actions_support import daemon_process, free_port, wait_for, write_config
from api_support import api_on, serve
from daemon_support import simulated_daemon

from gpuwatchd.actions.client import DaemonClient
from gpuwatchd.actions.scheduler import DRAIN_NOTE
from gpuwatchd.config import MIN_POLL_INTERVAL, ApiConfig, Config, DaemonConfig

CLIENTS = 200
REQUESTS_EACH = 5
PATHS = ("/metrics", "/api/v1/status", "/api/v1/quarantines", "/api/v1/journal?limit=50")


@pytest.mark.slow
def test_two_hundred_concurrent_clients_are_all_answered_while_polls_go_on(
    tmp_path: Path,
) -> None:
    with api_on(tmp_path) as api:
        answers: Counter[int | str] = Counter()
        lock = threading.Lock()
        start = threading.Barrier(CLIENTS + 1)

        def client(number: int) -> None:
            start.wait()
            for request in range(REQUESTS_EACH):
                path = PATHS[(number + request) % len(PATHS)]
                try:
                    with urllib.request.urlopen(api.url + path, timeout=30) as response:
                        response.read()
                        outcome: int | str = response.status
                except urllib.error.HTTPError as error:
                    outcome = error.code
                except OSError as error:
                    outcome = type(error).__name__
                with lock:
                    answers[outcome] += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        polls_before = api.sim.daemon.snapshot.polls
        start.wait()
        # The poll loop runs on while the clients hammer the listener.
        while any(thread.is_alive() for thread in threads):
            api.sim.daemon.step()
            api.sim.clock.advance(10)
        for thread in threads:
            thread.join(timeout=120)
        assert answers == {200: CLIENTS * REQUESTS_EACH}
        assert api.sim.daemon.snapshot.polls > polls_before
        assert api.server.connections.cut_off == 0


TRICKLERS = 800
WRITERS = 50
WRITES_EACH = 20
WRITTEN = ("gpu:0", "gpu:1", "gpu:2", "gpu:3")
# A write not answered in this long counts as unanswered. Not the client's
# 5 s: with 50 writers and the poll loop on two cores other work keeps busy
# (load 12-35), a write waited its turn past 5 s (18 of 1000 timed out while
# every other was answered); a write the daemon drops waits for ever.
WRITE_ANSWERED_S = 60.0


def test_a_thousand_writes_from_fifty_writers_are_each_answered(tmp_path: Path) -> None:
    # Review adversarial-2, row 219: 50 writers quarantining and releasing the
    # same GPUs, polls going on; 4 of 1000 got no answer when a release came
    # between a quarantine and the listing its answer was read from.
    with api_on(tmp_path) as api:
        answers: Counter[int | str] = Counter()
        lock = threading.Lock()
        start = threading.Barrier(WRITERS + 1)

        def writer(number: int) -> None:
            start.wait()
            for write in range(WRITES_EACH):
                subject = WRITTEN[(number + write // 2) % len(WRITTEN)]
                try:
                    if write % 2 == 0:
                        body = {"subject": subject, "reason": "load"}
                        outcome: int | str = api.request(
                            "POST", "/api/v1/quarantines", body, timeout=WRITE_ANSWERED_S
                        )[0]
                    else:
                        outcome = api.request(
                            "DELETE",
                            f"/api/v1/quarantines/{subject}",
                            timeout=WRITE_ANSWERED_S,
                        )[0]
                except OSError as error:
                    outcome = type(error).__name__
                with lock:
                    answers[outcome] += 1

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        start.wait()
        while any(thread.is_alive() for thread in threads):
            api.sim.daemon.step()
            api.sim.clock.advance(10)
        for thread in threads:
            thread.join()
        assert sum(answers.values()) == WRITERS * WRITES_EACH
        # 201 quarantined, 200 released or already quarantined, 404 released
        # by another writer first: never a 5xx, never a connection dropped.
        assert set(answers) <= {200, 201, 404}, answers


@pytest.fixture
def descriptors() -> Iterator[Callable[[int], None]]:
    """Raises this process' open-file limit to what a test needs (restored
    after); skips the test where the hard limit is lower."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)

    def at_least(count: int) -> None:
        soft, hard = limits
        if hard != resource.RLIM_INFINITY and hard < count:
            pytest.skip(f"needs {count} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, count), hard))

    yield at_least
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def _trickling(address: tuple[str, int], count: int) -> list[socket.socket]:
    """`count` connections that sent part of a request's headers, then hang on."""
    opened = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: gpuwatchd\r\n")
        opened.append(sock)
    return opened


def test_a_scrape_is_answered_while_eight_hundred_trickling_connections_hang_on(
    tmp_path: Path, descriptors: Callable[[int], None]
) -> None:
    # Review adversarial-2, row 220: 256 such connections took every slot and
    # Prometheus' scrape was closed unanswered. The header timeout is put out
    # of reach here: what frees a slot for the scrape is that those who sent
    # no request give theirs up to newcomers.
    descriptors(TRICKLERS + 2 * ApiConfig().max_connections)
    with api_on(tmp_path) as api:
        server = serve(api.sim, tmp_path / "api-token", ApiConfig(header_timeout=600.0))
        host, port = server.server_address[:2]
        threads = threading.active_count()
        tricklers = _trickling((str(host), int(port)), TRICKLERS)
        try:
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
                assert response.status == 200
                assert b"gpuwatchd_last_poll_timestamp_seconds" in response.read()
            assert server.connections.open <= ApiConfig().max_connections
            assert threading.active_count() - threads <= ApiConfig().max_connections + 1
        finally:
            for sock in tricklers:
                sock.close()
            server.stop()


def test_a_daemon_of_1024_descriptors_is_scraped_through_1100_trickling_connections(
    tmp_path: Path, descriptors: Callable[[int], None]
) -> None:
    # Row 221: systemd's default limit; the connections stay under it, the
    # scrapes are answered and polls go on.
    descriptors(1100 + 256)
    port = free_port()
    config = write_config(tmp_path / "gpuwatchd.yaml", tmp_path / "state", port, {})
    with daemon_process(config, descriptors=1024) as running:
        client = DaemonClient(running.url)
        polls = client.get("/api/v1/status")["polls"]
        tricklers = _trickling(("127.0.0.1", port), 1100)
        try:
            for _ in range(3):
                assert "gpuwatchd_last_poll_timestamp_seconds" in running.metrics()
            wait_for(lambda: client.get("/api/v1/status")["polls"] > polls, "polls to go on")
        finally:
            for sock in tricklers:
                sock.close()
        log = running.stop()
    assert "Too many open files" not in log
    assert "Traceback" not in log


def _resources(state_dir: Path) -> tuple[int, int, int, int]:
    """Resident memory (bytes), open descriptors, threads, database bytes."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    database = sum(p.stat().st_size for p in state_dir.iterdir() if p.name.startswith("state.db"))
    return resident, len(os.listdir("/proc/self/fd")), threading.active_count(), database


SOAK_POLLS = int(os.environ.get("GPUWATCHD_SOAK_POLLS", "1000"))
# The shortest interval the config accepts: where the most samples come in.
SOAK_INTERVAL = MIN_POLL_INTERVAL


@pytest.mark.slow
def test_a_long_run_at_the_shortest_interval_keeps_resources_flat(tmp_path: Path) -> None:
    # History holds its hour once an hour of polls has run (36 000 at 0.1 s:
    # its samples are kept 0.88 s apart, 4096 a subject): a run longer than
    # that (CI's 50 000 polls) compares memory between two points after it, a
    # shorter one between a quarter of it and its end. (A shorter history
    # fills sooner but keeps its samples denser: each poll's checks then read
    # more of them, and 40 000 polls of a 15-minute history took longer than
    # 10^5 of the hour.)
    full = int(DaemonConfig().history / SOAK_INTERVAL) + 1
    first = full + (SOAK_POLLS - full) // 10 if 2 * full < SOAK_POLLS else SOAK_POLLS // 4
    # Faults that come and go every few minutes: the journal grows, and is pruned.
    scenario = (
        "node: {gpus: 2, nvlinks: 2, hcas: 0}\n"
        "faults: ["
        + ", ".join(
            f"{{kind: thermal_throttle, gpu: 1, at: {start}s, for: 60s}}"
            for start in range(100, int(SOAK_POLLS * SOAK_INTERVAL / 2), 300)
        )
        + "]\n"
    )
    daemon = DaemonConfig(poll_interval=SOAK_INTERVAL, journal_retention=600.0)
    with simulated_daemon(scenario, tmp_path, Config(daemon=daemon)) as sim:
        state_dir = tmp_path / "state"
        samples = []
        for poll in range(SOAK_POLLS):
            sim.daemon.step()
            sim.clock.advance(SOAK_INTERVAL)
            if poll in (first, SOAK_POLLS - 1):
                samples.append(_resources(state_dir))
    (memory_1, fds_1, threads_1, db_1), (memory_2, fds_2, threads_2, db_2) = samples
    print(
        f"soak: {SOAK_POLLS} polls; resident {memory_1 >> 20} -> {memory_2 >> 20} MiB, "
        f"fds {fds_1} -> {fds_2}, threads {threads_1} -> {threads_2}, "
        f"database {db_1 >> 10} -> {db_2 >> 10} KiB"
    )
    assert fds_2 == fds_1 and threads_2 == threads_1
    assert memory_2 - memory_1 < 32 << 20
    assert db_2 < 2 * db_1 + (1 << 20)


def test_the_journal_is_pruned_to_its_retention_but_drain_records_are_kept(
    tmp_path: Path,
) -> None:
    config = Config(daemon=DaemonConfig(journal_retention=86400.0))
    with simulated_daemon("node: {gpus: 1, nvlinks: 1, hcas: 0}\n", tmp_path, config) as sim:
        store, now = sim.daemon.store, sim.clock.now()
        store.journal.note("note", "node", "old", now - 2 * 86400)
        store.journal.note(
            DRAIN_NOTE, "node", "slurm drained n1: gpuwatchd: node x", now - 2 * 86400
        )
        store.journal.note("note", "node", "recent", now - 3600)
        sim.daemon.step()
        messages = [e.message for e in store.journal.entries(since=0, limit=100)]
    assert "old" not in messages
    assert "recent" in messages and "slurm drained n1: gpuwatchd: node x" in messages
