"""What `gpuwatchd status` shows: a Snapshot as JSON (the /api/v1/status
document) and that JSON as a table for people. The table is drawn from the
JSON, so the CLI shows the same thing for a local or a remote node."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwatchd.canary.confirm import OFFLINE_DIAGNOSTIC, Lead, Watch
from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.model import Finding, GpuSample, Health, PortSample, Quarantine, Severity
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.terminal import Paint, plain

JsonDict = dict[str, Any]


def _gpu_json(gpu: GpuSample, snapshot: Snapshot) -> JsonDict:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "up": gpu.up,
        "health": snapshot.health.get(gpu.subject, Health.HEALTHY).label,
        "temperature_celsius": gpu.temperature_gpu_celsius,
        "memory_temperature_celsius": gpu.temperature_memory_celsius,
        "slowdown_temperature_celsius": gpu.temperature_slowdown_celsius,
        "sm_clock_hertz": gpu.sm_clock_hertz,
        "sm_max_clock_hertz": gpu.sm_max_clock_hertz,
        "power_watts": gpu.power_watts,
        "power_limit_watts": gpu.power_limit_watts,
        "utilization_ratio": gpu.utilization_gpu_ratio,
        "clocks_event_reasons": gpu.clocks_event_reasons,
        "ecc_errors": {f"{kind}_{scope}": n for (kind, scope), n in gpu.ecc_errors.items()},
        "row_remap_pending": gpu.row_remap_pending,
        "row_remap_failed": gpu.row_remap_failed,
        "nvlinks_up": sum(1 for link in gpu.nvlinks if link.up),
        "nvlinks": len(gpu.nvlinks),
        "xid_counts": {str(code): n for code, n in sorted(gpu.xid_counts.items())},
    }


def _port_json(port: PortSample, snapshot: Snapshot) -> JsonDict:
    return {
        "device": port.device,
        "port": port.port,
        "health": snapshot.health.get(port.subject, Health.HEALTHY).label,
        "state": port.state,
        "physical_state": port.physical_state,
        "rate_bytes_per_second": port.rate_bytes_per_second,
        "link_layer": port.link_layer,
    }


def finding_json(finding: Finding) -> JsonDict:
    """Every field of a finding and its fault code, as JSON (a severity by its
    label, an action by its value): a field Finding gains is in the API,
    `report` and the DCGM tier's output with it."""
    return {
        **{
            field.name: _plain(getattr(finding, field.name))
            for field in dataclasses.fields(Finding)
        },
        # Derived from the code, not a field.
        "fault_code": finding.fault_code,
    }


def quarantine_json(quarantine: Quarantine) -> JsonDict:
    """A quarantine as the API shows it: its fields and its fault code."""
    return {**dataclasses.asdict(quarantine), "fault_code": quarantine.fault_code}


def _plain(value: object) -> object:
    if isinstance(value, Severity):
        return value.label
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _subjects_json(snapshot: Snapshot) -> list[JsonDict]:
    findings: dict[str, list[Finding]] = defaultdict(list)
    for finding in snapshot.findings:
        findings[finding.subject].append(finding)
    subjects = sorted(set(snapshot.health) | set(findings))
    return [
        {
            "subject": subject,
            "state": snapshot.health.get(subject, Health.HEALTHY).label,
            "since": snapshot.health_since.get(subject),
            "findings": [finding_json(f) for f in findings.get(subject, [])],
        }
        for subject in subjects
    ]


def _suspect_json(lead: Lead | None) -> JsonDict | None:
    if lead is None:
        return None
    pending = [lead.suspect] if lead.suspect_results is None else []
    if lead.sibling is not None and lead.sibling_results is None:
        pending.append(lead.sibling)
    return {
        "since": lead.since,
        "canaries": sorted({result.canary for result in lead.evidence}),
        "sibling": lead.sibling,
        "reruns_pending": pending,
    }


def _watch_json(watch: Watch | None) -> JsonDict | None:
    if watch is None:
        return None
    return {
        "until": watch.until,
        "canary": watch.evidence.canary,
        "offline_diagnostic": OFFLINE_DIAGNOSTIC if watch.offline else None,
    }


def _canaries_json(stats: CanaryStats | None) -> list[JsonDict] | None:
    """Per target (a GPU, or the host's cores): its last all-pass burst, runs
    by outcome since the daemon started, the canaries whose latest run did
    not pass, and whether it is a suspect (a mismatch being re-run on it and
    a sibling) or watched (a mismatch not confirmed). None without canaries."""
    if stats is None:
        return None
    targets = sorted(
        {target for target, _ in stats.latest}
        | set(stats.last_pass)
        | set(stats.suspects)
        | set(stats.watches)
    )
    runs: dict[str, dict[str, int]] = defaultdict(dict)
    for (target, _, outcome), count in stats.runs.items():
        runs[target][outcome] = runs[target].get(outcome, 0) + count
    return [
        {
            "target": target,
            "last_pass": stats.last_pass.get(target),
            "runs": dict(sorted(runs[target].items())),
            "not_passing": {
                canary: result.result
                for (of, canary), result in sorted(stats.latest.items())
                if of == target and result.result != "pass"
            },
            "suspect": _suspect_json(stats.suspects.get(target)),
            "watch": _watch_json(stats.watches.get(target)),
        }
        for target in targets
    ]


def _sources_json(snapshot: Snapshot) -> JsonDict:
    """The polled sources, and the canaries: down while GPUs go unchecked
    for want of a GPU backend (CuPy), which would otherwise pass silently."""
    sources: JsonDict = {
        name: {"up": up, "error": snapshot.source_errors.get(name)}
        for name, up in snapshot.source_up.items()
    }
    if snapshot.canary is not None:
        unchecked = sorted(
            gpu for gpu, (reason, _) in snapshot.canary.unchecked.items() if reason == "no_backend"
        )
        error = (
            f"no GPU backend: GPU(s) {', '.join(map(str, unchecked))} unchecked"
            if unchecked
            else None
        )
        sources["canary"] = {"up": error is None, "error": error}
    return dict(sorted(sources.items()))


def to_json(snapshot: Snapshot) -> JsonDict:
    return {
        "time": snapshot.time,
        "polls": snapshot.polls,
        "node": {"health": snapshot.node_health.label},
        "driver_version": snapshot.driver_version,
        "state_persisted": snapshot.state_persisted,
        "sources": _sources_json(snapshot),
        "gpus": [_gpu_json(gpu, snapshot) for gpu in snapshot.gpus],
        "infiniband_ports": [_port_json(port, snapshot) for port in snapshot.ports],
        "subjects": _subjects_json(snapshot),
        "quarantines": [quarantine_json(q) for q in snapshot.quarantines],
        "webhooks": [dataclasses.asdict(w) for w in snapshot.webhooks],
        "schedulers": [dataclasses.asdict(s) for s in snapshot.schedulers],
        "canaries": _canaries_json(snapshot.canary),
    }


def _cell(value: object, scale: float = 1.0, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return f"{value / scale:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]], paint: Paint = plain) -> list[str]:
    """Aligned columns; `paint` styles a cell after its width is measured."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            paint(cell) + " " * (w - len(cell)) for cell, w in zip(row, widths, strict=True)
        ).rstrip()
        for row in [header, *rows]
    ]


def format_time(timestamp: object) -> str:
    if not isinstance(timestamp, int | float):
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def render_table(data: Mapping[str, Any], paint: Paint = plain) -> str:
    """The status document for people; `paint` colours what is wrong (terminal.py)."""
    lines = [
        f"node health: {paint(data['node']['health'])}    as of {format_time(data['time'])}"
        f"    driver {data.get('driver_version') or '-'}",
    ]
    sources = ", ".join(
        f"{name} {'up' if info['up'] else paint('DOWN') + ' (' + str(info['error']) + ')'}"
        for name, info in data["sources"].items()
    )
    lines.append(f"sources: {sources or 'none'}")
    if not data["state_persisted"]:
        lines.append("WARNING: the state database cannot be written; decisions are not persisted")
    if data["gpus"]:
        lines.append("")
        lines.extend(
            _table(
                [
                    "GPU",
                    "NAME",
                    "UP",
                    "HEALTH",
                    "TEMP C",
                    "HBM C",
                    "SM MHz",
                    "MAX MHz",
                    "POWER W",
                    "UTIL %",
                    "NVLINK",
                    "XIDS",
                ],
                [
                    [
                        str(g["index"]),
                        _cell(g["name"]),
                        _cell(g["up"]),
                        g["health"],
                        _cell(g["temperature_celsius"]),
                        _cell(g["memory_temperature_celsius"]),
                        _cell(g["sm_clock_hertz"], 1e6),
                        _cell(g["sm_max_clock_hertz"], 1e6),
                        _cell(g["power_watts"]),
                        _cell(g["utilization_ratio"], 0.01),
                        f"{g['nvlinks_up']}/{g['nvlinks']}",
                        ",".join(f"{code}x{n}" for code, n in g["xid_counts"].items()) or "-",
                    ]
                    for g in data["gpus"]
                ],
                paint,
            )
        )
    if data["infiniband_ports"]:
        lines.append("")
        lines.extend(
            _table(
                ["PORT", "HEALTH", "STATE", "PHYS", "RATE Gb/s", "LAYER"],
                [
                    [
                        f"{p['device']}/{p['port']}",
                        p["health"],
                        _cell(p["state"]),
                        _cell(p["physical_state"]),
                        _cell(p["rate_bytes_per_second"], 1.25e8),
                        _cell(p["link_layer"]),
                    ]
                    for p in data["infiniband_ports"]
                ],
                paint,
            )
        )
    unwell = [s for s in data["subjects"] if s["findings"] or s["state"] != "healthy"]
    if unwell:
        lines.append("")
        lines.append("findings:")
        for subject in unwell:
            lines.append(
                f"  {subject['subject']}: {paint(subject['state'])} "
                f"since {format_time(subject['since'])}"
            )
            for finding in subject["findings"]:
                evidence = " ".join(
                    f"{k}={_evidence_value(v)}" for k, v in finding["evidence"].items()
                )
                lines.append(
                    f"    [{paint(finding['severity'])}] {_fault(finding)}{finding['check']}/"
                    f"{finding['code']}: {finding['message']} (action: {finding['action']}) "
                    f"{evidence}".rstrip()
                )
    if data["quarantines"]:
        lines.append("")
        lines.append("quarantines:")
        for q in data["quarantines"]:
            board = f" [{q['uuid']}]" if q.get("uuid") else ""
            lines.append(
                f"  {q['subject']}{board}: {_fault(q)}{q['reason']} "
                f"({q['source']}, since {format_time(q['since'])})"
            )
    lines.extend(_canary_lines(data))
    lines.extend(_actions_lines(data))
    return "\n".join(lines)


def _fault(item: Mapping[str, Any]) -> str:
    """A finding's or quarantine's fault code and a space; `.get`: a daemon
    older than the catalog has none."""
    code = item.get("fault_code")
    return f"{code} " if code else ""


def _evidence_value(value: object) -> str:
    """Four significant digits: `400.0086441040039` s is 400 s to whoever reads it."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _canary_lines(data: Mapping[str, Any]) -> list[str]:
    canaries = data.get("canaries")
    if not canaries:
        return []
    rows = [
        [
            c["target"],
            format_time(c["last_pass"]),
            " ".join(f"{outcome} {n}" for outcome, n in c["runs"].items()) or "-",
            ", ".join(f"{name} {outcome}" for name, outcome in c["not_passing"].items()) or "-",
        ]
        for c in canaries
    ]
    lines = ["", *_table(["CANARY TARGET", "LAST PASS", "RUNS", "NOT PASSING NOW"], rows)]
    doubts = [f"  {c['target']}: {doubt}" for c in canaries if (doubt := _doubt(c))]
    return [*lines, "", "canaries under doubt:", *doubts] if doubts else lines


def _doubt(canary: Mapping[str, Any]) -> str | None:
    """A suspect's re-runs, or a watch; `.get`: a daemon of an older version has neither."""
    suspect, watch = canary.get("suspect"), canary.get("watch")
    if suspect:
        names = suspect["canaries"]
        what = ", ".join(names) if len(names) <= 2 else f"{len(names)} canaries ({names[0]}...)"
        pending = ", ".join(suspect["reruns_pending"]) or "none"
        sibling = suspect["sibling"] or "none, so no verdict is possible"
        return (
            f"suspect since {format_time(suspect['since'])}: {what} mismatched; "
            f"sibling {sibling}; re-runs pending on {pending}"
        )
    if watch:
        line = f"watched until {format_time(watch['until'])}: {watch['canary']} mismatched"
        if watch["offline_diagnostic"]:
            line += f"; run {watch['offline_diagnostic']}"
        return line
    return None


def render_quarantines(quarantines: Sequence[Mapping[str, Any]]) -> str:
    """`gpuwatchd quarantine list`: one row a quarantine."""
    if not quarantines:
        return "no quarantines"
    rows = [
        [
            q["subject"],
            q.get("uuid") or "-",
            q["source"] + (" (dry run)" if q["dry_run"] else ""),
            format_time(q["since"]),
            q["operator"] or "-",
            "yes" if q["hardware"] else "no",
            q["reason"],
        ]
        for q in quarantines
    ]
    header = ["SUBJECT", "UUID", "SOURCE", "SINCE", "OPERATOR", "HARDWARE", "REASON"]
    return "\n".join(_table(header, rows))


def _actions_lines(data: Mapping[str, Any]) -> list[str]:
    lines = []
    webhooks = data.get("webhooks") or []
    if webhooks:
        lines += ["", "webhooks:"]
        for w in webhooks:
            line = (
                f"  {w['name']}: {w['pending']} pending, {w['dead_letters']} dead letters "
                f"({w['delivered']} delivered, {w['retried']} retries since start)"
            )
            if w["last_error"]:
                line += f"; last error: {w['last_error']}"
            lines.append(line)
    schedulers = data.get("schedulers") or []
    if schedulers:
        lines += ["", "schedulers:"]
        for s in schedulers:
            state = "drained by gpuwatchd" if s["drained"] else "not drained by gpuwatchd"
            notes = [
                "dry run" if s["dry_run"] else "",
                f"drain held back: {s['withheld']}" if s["withheld"] else "",
                f"error: {s['error']}" if s["error"] else "",
            ]
            lines.append(f"  {s['name']} ({s['node']}): {'; '.join([state, *filter(None, notes)])}")
    return lines
