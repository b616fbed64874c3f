"""Test support for the DCGM tier: a fake `dcgmi` on PATH, as the Slurm
tests have a fake `scontrol`.

It answers `dcgmi diag -r LEVEL -i IDS -j` as DCGM 4 does: the JSON of
DCGM's schema (tests/fixtures/dcgm/dcgm_diag_schema.json), one result per
GPU id of each test of the level, the GPUs listed with their serial numbers
under `entity_groups`. Its state file (set by the test) says how: `fail`
maps a DCGM GPU id to the test that fails on it, `serials` gives each GPU
id's serial (none listed: DCGM read none), `exit` is its exit status
whatever the JSON says, and `mode` makes it a dcgmi that cannot run:
`no_host_engine` (dcgmi's message, no JSON), `runtime_error` (DCGM's JSON
for a diagnostic that could not start), `garbage` (text that is no JSON),
`hang` (never answers). Every call's arguments are logged.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_DCGMI = '''#!{python}
"""A fake dcgmi: `diag -r LEVEL -i IDS -j` from {state}, every call logged."""
import json, sys, time
state_path, calls_path = {state!r}, {calls!r}
with open(state_path) as handle:
    state = json.load(handle)
with open(calls_path, "a") as handle:
    handle.write(json.dumps(sys.argv[1:]) + "\\n")
mode = state.get("mode", "ok")
if mode == "hang":
    time.sleep(60)
if mode == "no_host_engine":
    print("Error: unable to establish a connection to the specified host: localhost")
    print("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.")
    sys.exit(255)
if mode == "garbage":
    print("Segmentation fault (core dumped) in libdcgm")
    sys.exit(139)
args = sys.argv[1:]
level = int(args[args.index("-r") + 1])
gpus = [int(g) for g in args[args.index("-i") + 1].split(",")]
if mode == "runtime_error":
    why = "Error: GPU 0 is in use by another process"
    document = {{"DCGM Diagnostic": {{"runtime_error": why}}}}
    print(json.dumps(document, indent=4))
    sys.exit(state.get("exit", 226))
tests = [("Deployment", "software")]
if level >= 2:
    tests += [("Integration", "pcie"), ("Hardware", "memory")]
if level >= 3:
    tests += [("Hardware", "diagnostic"), ("Stress", "targeted_stress")]
fail = {{int(gpu): test for gpu, test in state.get("fail", {{}}).items()}}
serials = {{int(gpu): serial for gpu, serial in state.get("serials", {{}}).items()}}
categories = {{}}
for category, test in tests:
    results = []
    for gpu in gpus:
        result = {{"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": "Pass"}}
        if fail.get(gpu) == test:
            result["status"] = "Fail"
            result["warnings"] = [{{
                "error_category": 10,
                "error_id": 52,
                "error_severity": 2,
                "warning": f"Found 3 faulty memory elements on GPU {{gpu}}",
            }}]
        results.append(result)
    failed = any(r["status"] == "Fail" for r in results)
    summary = {{"status": "Fail" if failed else "Pass"}}
    categories.setdefault(category, []).append(
        {{"name": test, "results": results, "test_summary": summary}}
    )
entities = []
for gpu in gpus:
    entity = {{"entity_id": gpu, "device_id": "2330"}}
    if gpu in serials:
        entity["serial_num"] = serials[gpu]
    entities.append(entity)
document = {{
    "DCGM Diagnostic": {{
        "test_categories": [{{"category": c, "tests": t}} for c, t in categories.items()]
    }},
    "entity_groups": [{{"entity_group": "GPU", "entity_group_id": 1, "entities": entities}}],
    "metadata": {{"version": "4.6.0", "Driver Version Detected": "570.172.08"}},
}}
print(json.dumps(document, indent=4))
sys.exit(state.get("exit", 226 if fail else 0))
'''


@dataclass
class FakeDcgmi:
    path: Path
    state_path: Path
    calls_path: Path

    def set(self, **state: Any) -> None:
        self.state_path.write_text(json.dumps(state))

    def calls(self) -> list[list[str]]:
        if not self.calls_path.exists():
            return []
        return [json.loads(line) for line in self.calls_path.read_text().splitlines()]


def fake_dcgmi(directory: Path, **state: Any) -> FakeDcgmi:
    """A fake `dcgmi` in `directory` (put it first on PATH, or name it in
    canary.dcgm.dcgmi), answering as `state` says."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = FakeDcgmi(directory / "dcgmi", directory / "dcgmi.json", directory / "dcgmi-calls.log")
    fake.set(**state)
    fake.path.write_text(
        FAKE_DCGMI.format(
            python=sys.executable, state=str(fake.state_path), calls=str(fake.calls_path)
        )
    )
    fake.path.chmod(0o755)
    return fake
