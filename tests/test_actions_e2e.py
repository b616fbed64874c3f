"""End to end, as on a node: `gpuwatchd run` over a simulated node whose GPU 1
has an uncorrectable ECC error, with an Alertmanager-format webhook to a
receiver of the test's own and Slurm through a fake `scontrol`. The fault
quarantines the GPU and the node, the receiver gets the alert, the node is
drained; `gpuwatchd quarantine release` puts the GPU back, the node's share
quarantine ends, the receiver gets the resolution and the node is resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actions_support import (
    Receiver,
    daemon_process,
    fake_scontrol,
    free_port,
    receiver,
    wait_for,
    write_config,
)
from click.testing import CliRunner

from gpuwatchd.cli import main

SCENARIO = """\
node: {gpus: 4, nvlinks: 4, hcas: 2}
faults:
  - {at: 1s, kind: ecc_uncorrectable, gpu: 1}
"""


def _alerts(hook: Receiver, alertname: str, subject: str, status: str) -> list[dict[str, Any]]:
    return [
        alert
        for payload in hook.payloads()
        for alert in payload["alerts"]
        if alert["labels"]["alertname"] == alertname
        and alert["labels"]["subject"] == subject
        and alert["status"] == status
    ]


def test_ecc_fault_to_alert_and_drain_then_release_to_resolution_and_resume(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "ecc.yaml"
    scenario.write_text(SCENARIO)
    scontrol = fake_scontrol(tmp_path / "slurm")
    with receiver() as hook:
        actions = {
            "node_name": "gpu-node-7",
            "webhooks": [
                {"name": "am", "url": hook.url, "format": "alertmanager", "retry_initial": "100ms"}
            ],
            "slurm": {
                "enabled": True,
                "node_name": "gpu-node-7",
                "scontrol": str(scontrol.path),
                "retry_interval": "1s",
            },
            "fleet_safety": {"enabled": False},
        }
        config = write_config(
            tmp_path / "gpuwatchd.yaml", tmp_path / "state", free_port(), {"actions": actions}
        )
        with daemon_process(config, simulate=str(scenario)) as daemon:
            fired = wait_for(
                lambda: _alerts(hook, "GpuwatchdQuarantined", "gpu:1", "firing"),
                "the quarantine alert",
            )
            assert fired[0]["labels"]["node"] == "gpu-node-7"
            assert fired[0]["labels"]["severity"] == "critical"
            wait_for(lambda: scontrol.state["state"] == "IDLE+DRAIN", "the drain")
            (drain,) = scontrol.updates()
            assert drain[:3] == ["update", "NodeName=gpu-node-7", "State=DRAIN"]
            assert drain[3].startswith("Reason=gpuwatchd: ")
            drained = 'gpuwatchd_scheduler_drained{scheduler="slurm"} 1.0'
            wait_for(lambda: drained in daemon.metrics(), "the drain on /metrics (next poll)")

            released = CliRunner().invoke(
                main,
                [
                    "quarantine",
                    "release",
                    "gpu:1",
                    "--reason",
                    "GPU replaced",
                    "--config",
                    str(config),
                ],
            )
            assert released.exit_code == 0, released.output

            wait_for(
                lambda: _alerts(hook, "GpuwatchdQuarantined", "gpu:1", "resolved"),
                "the quarantine's resolution",
            )
            wait_for(lambda: scontrol.state["state"] == "IDLE", "the resume")
            assert scontrol.updates()[-1] == ["update", "NodeName=gpu-node-7", "State=RESUME"]
            log = daemon.stop()
    assert "slurm: drained gpu-node-7" in log and "slurm: resumed gpu-node-7" in log
    keys = [request.headers["Idempotency-Key"] for request in hook.received]
    assert len(keys) == len(set(keys))
