"""A fleet's monitoring stack on loopback, as a site runs it past one
Prometheus: simulated nodes, two scrapers sharded by `hashmod`, remote write
to a central VictoriaMetrics, the fleet rules evaluated by vmalert against
it, and Alertmanager with the shipped routing.

    scripts/fleet-stack [--nodes 200] [--shape gpu|full] [--duration 10m]
                        [--base-port 19500] [--time-scale 30] [--interval 5]
                        [--rules fleet|all] [--measure 60] [--workdir DIR]

- The nodes: one process (python -m gpuwatchd.sim.fleet) runs a production
  daemon per simulated node and serves each node's /metrics at
  /nodes/NAME/metrics on one port. Half the nodes are cluster `a` (8 x H100
  each), half cluster `b` (8 x H100, and a fifth of them 8 x A100). Some have
  faults: `fleet()` says which, and the alerts they must raise.
  `--shape gpu` simulates the GPUs only (no NVLink, no InfiniBand: about 600
  series a node, and a tenth of the CPU); `full` is the whole HGX node
  (18 NVLinks a GPU, 8 HCAs: about 2,100 series).
- Two Prometheus in agent mode scrape every --interval seconds, each the
  targets whose hash of (__address__, __metrics_path__) modulo 2 is its
  number, and remote-write to VictoriaMetrics. An agent keeps no TSDB and
  runs no rules: it is the cheapest per-cluster scraper.
- vmalert evaluates config/prometheus/rules' recording and fleet groups
  (`--rules all`: the node alerts too) against VictoriaMetrics every
  --interval, writes the recorded series back to it and sends alerts to
  Alertmanager, whose webhook and Slack receivers point at this process.
  Every duration of the rules (`for:`, range windows, offsets) is divided by
  --time-scale, as scripts/demo-stack does, so that alerts meant to wait 15
  minutes fire within seconds.

Everything listens on 127.0.0.1 from --base-port: VictoriaMetrics (its UI at
/vmui), vmalert +1, Alertmanager +2, the receiver +3, the scrapers +4 and +5,
the nodes +6. The stack stops by itself after --duration, or on Ctrl-C, and
removes its work directory unless --workdir was given. With --measure S it
prints what docs/SCALING.md reports, measured over S seconds from --warmup
seconds after the nodes are up: samples ingested a second, series, rule
evaluation time, and each process's memory and CPU.

Needs the Debian packages prometheus, prometheus-alertmanager and
victoria-metrics (victoria-metrics, vmalert), and the project's virtual
environment (the nodes are gpuwatchd).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from demo_stack import (
    JOB,
    RULES,
    Notification,
    Receiver,
    Services,
    binary,
    instant_query,
    print_notification,
    scale_rules,
    stop_on_signal,
)

SHARDS = 2
FLEET_RULE_FILES = ("gpuwatchd-recording.yml", "gpuwatchd-fleet.yml")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
# Links a GPU of the whole node (`--shape full`) has, by model.
NVLINKS = {H100: 18, A100: 12}
HCAS = 8
# The share of a cluster's GPUs that GpuwatchdFleetQuarantineHigh tolerates.
QUARANTINE_ALERT_RATIO = 0.05
LOST_GPUS_PER_NODE = 4
FAULT_AT = "2s"
NODES_READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Member:
    """A simulated node of the fleet, with the cluster its scrape target names."""

    name: str
    cluster: str
    model: str
    faults: tuple[dict[str, Any], ...] = ()


def _lost(gpus: int) -> tuple[dict[str, Any], ...]:
    return tuple({"at": FAULT_AT, "kind": "gpu_lost", "gpu": gpu} for gpu in range(gpus))


def _drift(gpu: int) -> dict[str, Any]:
    return {"at": FAULT_AT, "kind": "clock_drift", "gpu": gpu, "ratio": 0.7}


def _thermal(gpu: int) -> dict[str, Any]:
    return {"at": FAULT_AT, "kind": "thermal_throttle", "gpu": gpu}


def fleet(count: int) -> tuple[Member, ...]:
    """`count` nodes (at least 20): cluster `a` the first half, all H100;
    cluster `b` the rest, its last fifth A100. Faults:

    - a-001 GPU 2 and b-001 GPU 6 clock 30 % slow (clock_drift);
    - a-002 GPU 5 overheats (thermal_throttle: HW slowdown halves its clock);
    - the first A100 node of b overheats on GPU 1, the second drifts on GPU 3;
    - a-003 GPU 4 runs with ECC off, unlike the rest of its cluster (config_drift);
    - in `a`, enough nodes lose 4 GPUs each (gpu_lost: quarantined) that 7 %
      of the cluster's GPUs are quarantined; in `b`, one node, under 1 %.
    """
    if count < 20:
        raise ValueError("a fleet of at least 20 nodes (each cluster needs a spread)")
    half = count // 2
    a100_from = (count - half) - (count - half) // 5
    members = [Member(f"a-{i:03d}", "a", H100) for i in range(half)]
    members += [
        Member(f"b-{i:03d}", "b", A100 if i >= a100_from else H100) for i in range(count - half)
    ]
    lost_nodes = math.ceil(0.07 * half * 8 / LOST_GPUS_PER_NODE)
    faults: dict[str, tuple[dict[str, Any], ...]] = {
        "a-001": (_drift(2),),
        "a-002": (_thermal(5),),
        # From the start: the daemon reads such settings at its first poll and
        # then every static_refresh (10 min), so a drift at FAULT_AT is seen
        # only where the node's first poll came later (a loaded machine's race).
        "a-003": ({"at": "0s", "kind": "config_drift", "gpu": 4, "setting": "ecc_mode"},),
        "b-001": (_drift(6),),
        f"b-{a100_from:03d}": (_thermal(1),),
        f"b-{a100_from + 1:03d}": (_drift(3),),
        f"b-{a100_from - 1:03d}": _lost(LOST_GPUS_PER_NODE),
    }
    for i in range(half - lost_nodes, half):
        faults[f"a-{i:03d}"] = _lost(LOST_GPUS_PER_NODE)
    return tuple(Member(m.name, m.cluster, m.model, faults.get(m.name, ())) for m in members)


def nodes_document(members: Sequence[Member], shape: str) -> dict[str, Any]:
    """The NODES.yaml of gpuwatchd.sim.fleet for `members`."""
    nodes = []
    for seed, member in enumerate(members, start=1):
        node = {
            "gpus": 8,
            "model": member.model,
            "nvlinks": NVLINKS[member.model] if shape == "full" else 0,
            "hcas": HCAS if shape == "full" else 0,
        }
        scenario = {"node": node, "seed": seed, "faults": list(member.faults)}
        nodes.append({"name": member.name, "scenario": scenario})
    return {"nodes": nodes}


class FleetStack(Services):
    def __init__(
        self,
        workdir: Path,
        base_port: int,
        members: Sequence[Member],
        *,
        time_scale: float = 30.0,
        interval: float = 5.0,
        shape: str = "gpu",
        rules: str = "fleet",
        duration: float = 600.0,
        echo: Callable[[Notification], None] | None = None,
    ) -> None:
        super().__init__(workdir, Receiver(base_port + 3, echo))
        self.members = tuple(members)
        self.time_scale = time_scale
        self.interval = interval
        self.shape = shape
        self.rules = rules
        self.duration = duration
        self.vm_url = f"http://127.0.0.1:{base_port}"
        self.vmalert_url = f"http://127.0.0.1:{base_port + 1}"
        self.alertmanager_url = f"http://127.0.0.1:{base_port + 2}"
        self.shard_urls = [f"http://127.0.0.1:{base_port + 4 + n}" for n in range(SHARDS)]
        self.nodes_address = f"127.0.0.1:{base_port + 4 + SHARDS}"
        self.started = time.time()

    def start(self) -> None:
        self._start_nodes()
        self._start_victoria_metrics()
        self.start_alertmanager(self.alertmanager_url.split("//")[1], self.receiver.url)
        self.wait_ready(
            {
                "victoria-metrics": f"{self.vm_url}/health",
                "alertmanager": f"{self.alertmanager_url}/-/ready",
            }
        )
        self._start_vmalert()
        for shard in range(SHARDS):
            self._start_shard(shard)
        waiting = {"vmalert": f"{self.vmalert_url}/health"}
        waiting |= {f"shard-{n}": f"{url}/-/ready" for n, url in enumerate(self.shard_urls)}
        self.wait_ready(waiting)
        # Building a daemon per node takes a while: the last to be ready.
        self.wait_ready({"nodes": f"http://{self.nodes_address}/healthz"}, NODES_READY_TIMEOUT_S)
        self.started = time.time()

    def _start_nodes(self) -> None:
        path = self.workdir / "nodes.yaml"
        path.write_text(yaml.safe_dump(nodes_document(self.members, self.shape), sort_keys=False))
        command = [sys.executable, "-m", "gpuwatchd.sim.fleet", str(path)]
        command += ["--listen", self.nodes_address, "--interval", f"{self.interval:g}s"]
        command += ["--state-dir", str(self.workdir / "nodes")]
        # The nodes stop by themselves a little after the stack would.
        command += ["--duration", f"{self.duration + NODES_READY_TIMEOUT_S:g}s"]
        for source in ("nvml", "infiniband") if self.shape == "full" else ("nvml",):
            command += ["--source", source]
        self.spawn("nodes", command)

    def _start_victoria_metrics(self) -> None:
        self.spawn(
            "victoria-metrics",
            [
                binary("victoria-metrics"),
                f"-storageDataPath={self.workdir / 'victoria-metrics-data'}",
                f"-httpListenAddr={self.vm_url.split('//')[1]}",
                "-retentionPeriod=1d",
                # Samples are queryable this long after they arrive (30s by
                # default): one interval, or the scaled rules would see
                # every change 30 s late.
                f"-search.latencyOffset={self.interval:g}s",
                "-loggerLevel=WARN",
            ],
        )

    def _write_rules(self) -> Path:
        rules = self.workdir / "rules"
        rules.mkdir(parents=True, exist_ok=True)
        for path in sorted(RULES.glob("*.yml")):
            if self.rules == "fleet" and path.name not in FLEET_RULE_FILES:
                continue
            document = scale_rules(yaml.safe_load(path.read_text()), self.time_scale)
            (rules / path.name).write_text(yaml.safe_dump(document, sort_keys=False))
        return rules

    def _start_vmalert(self) -> None:
        interval = f"{self.interval:g}s"
        self.spawn(
            "vmalert",
            [
                binary("vmalert", package="victoria-metrics"),
                f"-rule={self._write_rules() / '*.yml'}",
                f"-datasource.url={self.vm_url}",
                f"-remoteWrite.url={self.vm_url}",
                f"-remoteWrite.flushInterval={interval}",
                f"-notifier.url={self.alertmanager_url}",
                f"-httpListenAddr={self.vmalert_url.split('//')[1]}",
                f"-evaluationInterval={interval}",
                # An instant query looks back this far for a series' last
                # sample (5m by default): two scrapes, as Prometheus' lookback
                # spans a few of its scrapes.
                f"-datasource.queryStep={2 * self.interval:g}s",
                f"-rule.resendDelay={interval}",
                "-loggerLevel=WARN",
            ],
        )

    def _start_shard(self, shard: int) -> None:
        targets = [
            {
                "targets": [self.nodes_address],
                "labels": {
                    "cluster": member.cluster,
                    "instance": member.name,
                    "__metrics_path__": f"/nodes/{member.name}/metrics",
                },
            }
            for member in self.members
        ]
        interval = f"{self.interval:g}s"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": targets,
                    # Each scraper keeps the targets whose hash is its number.
                    # A real fleet's nodes differ by address; here they share
                    # one and differ by path, so both go into the hash.
                    "relabel_configs": [
                        {
                            "source_labels": ["__address__", "__metrics_path__"],
                            "modulus": SHARDS,
                            "target_label": "__tmp_shard",
                            "action": "hashmod",
                        },
                        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
                    ],
                }
            ],
            "remote_write": [{"url": f"{self.vm_url}/api/v1/write"}],
        }
        path = self.workdir / f"shard-{shard}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.spawn(
            f"shard-{shard}",
            [
                binary("prometheus"),
                "--enable-feature=agent",
                f"--config.file={path}",
                f"--storage.agent.path={self.workdir / f'shard-{shard}-data'}",
                f"--web.listen-address={self.shard_urls[shard].split('//')[1]}",
                "--log.level=warn",
            ],
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result from VictoriaMetrics."""
        return instant_query(self.vm_url, expr)

    def node_series(self) -> float:
        """The series a node exports, on average over the fleet."""
        total = 0
        for member in self.members:
            url = f"http://{self.nodes_address}/nodes/{member.name}/metrics"
            with urllib.request.urlopen(url, timeout=30) as response:
                lines = response.read().decode().splitlines()
            total += sum(1 for line in lines if line and not line.startswith("#"))
        return total / len(self.members)

    def measure(self, warmup: float, seconds: float, stop: threading.Event) -> dict[str, Any]:
        """Ingestion, series, rule evaluation, memory and CPU over `seconds`,
        from `warmup` seconds on."""
        if stop.wait(warmup):
            return {}
        before = _Sample.take(self)
        if stop.wait(seconds):
            return {}
        after = _Sample.take(self)
        elapsed = after.at - before.at
        vm, vmalert = after.vm, after.vmalert
        groups = {}
        for group in sorted({key[1] for key in vmalert if key[0] == "group"}):
            count = vmalert.get(("group", group, "count"), 0.0)
            total = vmalert.get(("group", group, "sum"), 0.0)
            groups[group] = {
                "mean_ms": 1e3 * total / count if count else None,
                "p90_ms": 1e3 * vmalert.get(("group", group, "0.9"), math.nan),
            }
        return {
            "nodes": len(self.members),
            "shape": self.shape,
            "interval_s": self.interval,
            "window_s": round(elapsed, 1),
            "samples_per_s": round((vm["rows"] - before.vm["rows"]) / elapsed),
            "series": int(vm["series"]),
            "series_per_node": round(self.node_series()),
            "rule_groups": groups,
            "rss_mib": {name: round(rss / 2**20) for name, (rss, _) in after.processes.items()},
            "cpu_cores": {
                name: round((cpu - before.processes[name][1]) / elapsed, 3)
                for name, (_, cpu) in after.processes.items()
                if name in before.processes
            },
            "node_round_s": after.round_seconds,
            "rules_failing": self.failing_rules(),
        }

    def failing_rules(self) -> dict[str, str]:
        """Rule -> the error of its last evaluation, for rules that failed."""
        with urllib.request.urlopen(f"{self.vmalert_url}/api/v1/rules", timeout=30) as response:
            groups = json.load(response)["data"]["groups"]
        return {
            rule["name"]: rule["lastError"]
            for group in groups
            for rule in group["rules"]
            if rule.get("lastError")
        }


_METRIC_LINE = re.compile(r"^([a-z_:]+)(\{[^}]*\})? ([-+0-9.eE]+|NaN)$")


def _metrics(url: str) -> list[tuple[str, str, float]]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    lines = []
    for line in text.splitlines():
        match = _METRIC_LINE.match(line)
        if match:
            lines.append((match.group(1), match.group(2) or "", float(match.group(3))))
    return lines


def _label(labels: str, name: str) -> str | None:
    match = re.search(rf'\b{name}="([^"]*)"', labels)
    return match.group(1) if match else None


@dataclass(frozen=True)
class _Sample:
    at: float
    vm: dict[str, float]
    vmalert: dict[tuple[str, ...], float]
    processes: dict[str, tuple[int, float]]  # name -> (RSS bytes, CPU seconds)
    round_seconds: float | None

    @staticmethod
    def take(stack: FleetStack) -> _Sample:
        vm = {"rows": 0.0, "series": 0.0}
        for name, labels, value in _metrics(stack.vm_url):
            if name == "vm_rows_inserted_total":
                vm["rows"] += value
            # Series written this hour: VictoriaMetrics' count of active series.
            elif name == "vm_cache_entries" and 'type="storage/hour_metric_ids"' in labels:
                vm["series"] = value
        vmalert: dict[tuple[str, ...], float] = {}
        for name, labels, value in _metrics(stack.vmalert_url):
            group = _label(labels, "group")
            if name.startswith("vmalert_iteration_duration_seconds") and group:
                quantile = _label(labels, "quantile")
                key = quantile or name.rsplit("_", 1)[-1]
                vmalert[("group", group, key)] = value
        processes = {
            name: _usage(process.pid)
            for name, process in stack.processes.items()
            if process.poll() is None
        }
        log = (stack.workdir / "logs" / "nodes.log").read_text().splitlines()
        rounds = [float(line.split()[-1].rstrip("s")) for line in log if line.startswith("round ")]
        return _Sample(time.monotonic(), vm, vmalert, processes, rounds[-1] if rounds else None)


def _usage(pid: int) -> tuple[int, float]:
    """A process's resident memory (bytes) and the CPU it has used (seconds)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return rss, cpu


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes (default 200)")
    parser.add_argument(
        "--shape",
        choices=("gpu", "full"),
        default="gpu",
        help="gpu: the GPUs alone, about 600 series a node; full: the whole HGX node, 18 "
        "NVLinks a GPU and 8 HCAs, about 2,100 (default gpu)",
    )
    parser.add_argument(
        "--duration", type=float, default=600.0, help="seconds, then it stops (default 600)"
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=19500,
        help="VictoriaMetrics' port; vmalert +1, Alertmanager +2, the receiver +3, the "
        "scrapers +4 and +5, the nodes +6 (default 19500)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=30.0,
        help="divide the rules' durations by this (default 30; 1 = as shipped)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds between polls, scrapes and rule evaluations (default 5)",
    )
    parser.add_argument(
        "--rules",
        choices=("fleet", "all"),
        default="fleet",
        help="fleet: the recording and fleet groups; all: the node alerts too (default fleet)",
    )
    parser.add_argument("--measure", type=float, help="print figures over this many seconds")
    parser.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="seconds from the nodes being up to --measure (default 30)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep configs, data and logs here (default: a temporary directory, removed)",
    )
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpuwatchd-fleet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = stop_on_signal()
    stack = FleetStack(
        workdir,
        args.base_port,
        fleet(args.nodes),
        time_scale=args.time_scale,
        interval=args.interval,
        shape=args.shape,
        rules=args.rules,
        duration=args.duration,
        echo=print_notification,
    )
    try:
        with stack:
            print(f"VictoriaMetrics {stack.vm_url}/vmui, vmalert {stack.vmalert_url}")
            print(f"Alertmanager {stack.alertmanager_url}; nodes {stack.nodes_address}")
            print(f"configs and logs in {workdir}; stops in {args.duration:g}s or on Ctrl-C")
            deadline = time.monotonic() + args.duration
            if args.measure is not None:
                figures = stack.measure(args.warmup, args.measure, stop)
                if figures:
                    print("measured:", yaml.safe_dump(figures, sort_keys=False), sep="\n")
            stop.wait(max(0.0, deadline - time.monotonic()))
            print("stopping")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
