"""Benchmark: the listener under 200 concurrent clients, while the daemon polls.

Usage:

    .venv/bin/python bench/bench_listener.py [--clients 200] [--seconds 15]

Starts `gpuwatchd run --simulate calm` (a real process, the real listener on
loopback, polling every second), then runs `--clients` client threads for
`--seconds`, each requesting /metrics, /api/v1/status, /api/v1/quarantines
and /api/v1/journal in turn on its own connection. Reports every request's
outcome (all should be 200), latency percentiles, and the daemon's poll
durations before and during the load (gpuwatchd_poll_duration_seconds), so
that a listener that slows polling shows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

PATHS = ("/metrics", "/api/v1/status", "/api/v1/quarantines", "/api/v1/journal?limit=50")


def _poll_stats(url: str) -> tuple[float, float]:
    """(count, sum) of gpuwatchd_poll_duration_seconds."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        for name in (
            "gpuwatchd_poll_duration_seconds_count",
            "gpuwatchd_poll_duration_seconds_sum",
        ):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
    return (
        values["gpuwatchd_poll_duration_seconds_count"],
        values["gpuwatchd_poll_duration_seconds_sum"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", type=int, default=200, help="client threads, a connection each (default 200)"
    )
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="how long they ask (default 15)"
    )
    parser.add_argument(
        "--port", type=int, default=19477, help="the daemon's loopback port (default 19477)"
    )
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable, "-m", "gpuwatchd", "run", "--simulate", "calm",
            "--interval", "1s", "--listen", f"127.0.0.1:{args.port}",
            "--state-dir", str(Path(scratch) / "state"),
        ]  # fmt: skip
        daemon = subprocess.Popen(command, stderr=subprocess.DEVNULL, env=dict(os.environ))
        try:
            for _ in range(300):
                try:
                    before = _poll_stats(url)
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                raise SystemExit("the daemon did not start")
            time.sleep(5)
            quiet = _poll_stats(url)
            outcomes: Counter[str] = Counter()
            latencies: list[float] = []
            lock = threading.Lock()
            deadline = time.monotonic() + args.seconds

            def client(number: int) -> None:
                request = number
                while time.monotonic() < deadline:
                    path = PATHS[request % len(PATHS)]
                    request += 1
                    started = time.perf_counter()
                    try:
                        with urllib.request.urlopen(url + path, timeout=30) as response:
                            response.read()
                            outcome = str(response.status)
                    except urllib.error.HTTPError as error:
                        outcome = str(error.code)
                    except OSError as error:
                        outcome = type(error).__name__
                    took = time.perf_counter() - started
                    with lock:
                        outcomes[outcome] += 1
                        latencies.append(took)

            threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            loaded = _poll_stats(url)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    cuts = statistics.quantiles(latencies, n=100)
    print(f"clients {args.clients} for {args.seconds:g}s: {len(latencies)} requests {outcomes}")
    print(
        f"latency p50 {cuts[49] * 1e3:.1f} ms, p99 {cuts[98] * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms"
    )
    quiet_polls, loaded_polls = quiet[0] - before[0], loaded[0] - quiet[0]
    quiet_mean = (quiet[1] - before[1]) / max(quiet_polls, 1) * 1e3
    loaded_mean = (loaded[1] - quiet[1]) / max(loaded_polls, 1) * 1e3
    print(
        f"polls: {quiet_polls:g} in 5s quiet (mean {quiet_mean:.1f} ms), "
        f"{loaded_polls:g} under load (mean {loaded_mean:.1f} ms)"
    )


if __name__ == "__main__":
    main()
