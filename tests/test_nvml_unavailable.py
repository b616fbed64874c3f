"""A GPU node whose NVML cannot start is unhealthy, loudly, and recovers by
itself; a node whose every source is down is `unknown`; a verdict the daemon
saved long ago is no verdict.

Through the simulated node (the fake library's nvmlInit answering an error,
the simulated PCI tree holding the GPUs), and on this machine's real
nvidia-ml-py where it finds no NVML library at all, with a sysfs tree of the
test's own holding one NVIDIA GPU function.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pynvml
import pytest
from actions_support import REPO, answers, free_port, wait_for
from click.testing import CliRunner
from daemon_support import simulated_daemon

from gpuwatchd.canary.cli import EXIT_CANNOT_RUN
from gpuwatchd.cli import main
from gpuwatchd.cli.canary import canary as canary_command
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.daemon import Daemon
from gpuwatchd.model import Action, Health, Reading, Severity
from gpuwatchd.policy import PolicyConfig, PolicyState, evaluate, quarantine_manually
from gpuwatchd.store import Store

NODE = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"
README = REPO / "README.md"
ROW = "| `nvml_init_error` "


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


NVML_ON_THIS_HOST = _nvml_loads()
no_nvml_here = pytest.mark.skipif(NVML_ON_THIS_HOST, reason="this host's NVML starts")


def gpu_on_the_bus(root: Path, address: str = "0000:18:00.0") -> Path:
    """A sysfs tree with one NVIDIA 3D controller on its PCI bus."""
    function = root / "bus" / "pci" / "devices" / address
    function.mkdir(parents=True)
    (function / "vendor").write_text("0x10de\n")
    (function / "class").write_text("0x030200\n")
    return root


def test_a_driver_not_loaded_leaves_the_node_critical_until_nvml_starts(tmp_path: Path) -> None:
    fault = "{at: 0s, kind: nvml_init_error, code: driver_not_loaded, for: 2m}"
    with simulated_daemon(f"{NODE}faults: [{fault}]\n", tmp_path) as sim:
        down = sim.run_until(60)
        assert down.source_up["nvml"] is False and down.gpus == ()
        [finding] = [f for f in down.findings if f.code == "nvml_unavailable"]
        assert (finding.subject, finding.severity, finding.definitive) == (
            "node",
            Severity.CRITICAL,
            False,
        )
        assert finding.action is Action.CHECK_DRIVER
        assert "Driver Not Loaded" in finding.message and "4 NVIDIA GPU(s)" in finding.message
        assert down.health["node"] is Health.UNHEALTHY
        # modprobe'd at 2 minutes: the next poll reads the GPUs, no restart.
        back = sim.run_until(130)
    assert back.source_up["nvml"] is True and len(back.gpus) == 4
    assert "nvml_unavailable" not in {f.code for f in back.findings}


def test_a_driver_upgraded_without_a_reboot_asks_for_the_reboot(tmp_path: Path) -> None:
    fault = "{at: 0s, kind: nvml_init_error, code: lib_rm_version_mismatch}"
    with simulated_daemon(f"{NODE}faults: [{fault}]\n", tmp_path) as sim:
        first = sim.daemon.step()
        assert "nvml_unavailable" in {f.code for f in first.findings}
        # Critical and confirmed: drained after policy.confirm_for, never for good.
        assert "node" not in {q.subject for q in sim.run_until(290).quarantines}
        snapshot = sim.run_until(300)
    [finding] = [f for f in snapshot.findings if f.code == "nvml_unavailable"]
    assert finding.action is Action.REBOOT and "reboot the node" in finding.message
    node = next(q for q in snapshot.quarantines if q.subject == "node")
    assert node.code == "nvml_unavailable" and not node.hardware
    # As the README's decision table says.
    row = next(line for line in README.read_text().splitlines() if line.startswith(ROW))
    assert row.endswith("| first poll | 5 min |")


@no_nvml_here
def test_a_gpu_node_without_any_nvml_serves_metrics_and_fails_the_slurm_check(
    tmp_path: Path,
) -> None:
    root = gpu_on_the_bus(tmp_path / "sys")
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gpuwatchd",
        "run",
        "--source",
        "nvml",
        "--sysfs-root",
        str(root),
        "--state-dir",
        str(tmp_path / "state"),
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        "200ms",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:

        def metrics() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return str(r.read().decode())
            except OSError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                return ""

        page = wait_for(lambda: "nvml_unavailable" in (m := metrics()) and m, "nvml_unavailable")
        assert 'gpuwatchd_source_up{source="nvml"} 0.0' in page
        check = CliRunner().invoke(
            main, ["slurm-healthcheck", "--node", f"http://127.0.0.1:{port}"]
        )
        assert check.exit_code == 1, check.output
        assert "NVML cannot start" in check.output and "0000:18:00.0" in check.output
    finally:
        process.terminate()
        process.wait(timeout=30)


@no_nvml_here
def test_canary_on_a_gpu_node_without_nvml_checks_nothing_and_says_so(tmp_path: Path) -> None:
    root = gpu_on_the_bus(tmp_path / "sys")
    result = CliRunner().invoke(canary_command, ["--sysfs-root", str(root)])
    assert result.exit_code == EXIT_CANNOT_RUN, result.output
    assert "no GPU was checked" in result.output and "0000:18:00.0" in result.output


class DownSource:
    name = "infiniband"

    def __init__(self) -> None:
        self.up = False

    def poll(self, now: float) -> Reading:
        if self.up:
            return Reading(source=self.name, time=now, ports=())
        return Reading(source=self.name, time=now, error="class/infiniband is missing")

    def close(self) -> None:
        pass


def test_a_node_whose_every_source_is_down_reads_unknown_until_one_works(
    tmp_path: Path,
) -> None:
    source, clock = DownSource(), FakeClock()
    config = Config(daemon=DaemonConfig(state_dir=str(tmp_path / "state")))
    daemon = Daemon(config, [source], clock)
    try:
        blind = daemon.step()
        assert blind.node_health is Health.UNKNOWN
        page = daemon.metrics.render("text/plain")[0].decode()
        assert 'gpuwatchd_node_health_state{state="unknown"} 1.0' in page
        assert 'gpuwatchd_health_state{state="unknown",subject="node"} 1.0' in page
        source.up = True
        clock.advance(10)
        assert daemon.step().node_health is Health.HEALTHY
    finally:
        daemon.close()


def test_run_with_infiniband_alone_on_a_host_without_it_reads_unknown_not_healthy(
    tmp_path: Path,
) -> None:
    # First-day review N10, as reproduced there: `run --source infiniband`
    # with no /sys/class/infiniband under the sysfs root.
    port = free_port()
    command = [
        sys.executable, "-m", "gpuwatchd", "run", "--source", "infiniband",
        "--sysfs-root", str(tmp_path / "sys"), "--state-dir", str(tmp_path / "state"),
        "--listen", f"127.0.0.1:{port}", "--interval", "200ms",
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(f"{url}/healthz"), "the first poll", timeout=60)
        status = CliRunner().invoke(main, ["status", "--json", "--node", url])
        check = CliRunner().invoke(main, ["slurm-healthcheck", "--node", url])
    finally:
        process.terminate()
        process.wait(timeout=30)
    document = json.loads(status.output)
    assert document["node"]["health"] == "unknown"
    assert document["sources"]["infiniband"]["up"] is False
    assert "no RDMA driver loaded" in document["sources"]["infiniband"]["error"]
    assert check.exit_code == 1 and check.output.startswith("gpuwatchd: node unknown")


def test_a_quarantined_node_stays_quarantined_while_blind() -> None:
    held = quarantine_manually(PolicyState(), "node", "maintenance", "alice", 0.0).state
    assert evaluate([], held, 10.0, PolicyConfig(), ("node",), blind=True).node_health is (
        Health.QUARANTINED
    )
    fresh = evaluate([], PolicyState(), 10.0, PolicyConfig(), ("node",), blind=True)
    assert fresh.node_health is Health.UNKNOWN


def _saved(state_dir: Path, wall: float) -> None:
    store = Store.open(str(state_dir))
    try:
        result = evaluate([], store.load_state(), wall, PolicyConfig(), ("node",))
        store.save_poll(result, now=wall, wall=wall)
    finally:
        store.close()


def _healthcheck(state_dir: Path, *flags: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["slurm-healthcheck", "--state-dir", str(state_dir), *flags])
    return result.exit_code, result.output


def test_a_verdict_saved_three_polls_ago_is_no_verdict_unless_failing_open(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    _saved(state, time.time() - 31)
    code, said = _healthcheck(state)
    assert code == 1 and "the daemon is not running and last polled" in said
    assert _healthcheck(state, "--fail-open")[0] == 0


def test_a_fresh_verdict_of_a_stopped_daemon_still_counts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _saved(state, time.time() - 5)
    assert _healthcheck(state) == (0, "gpuwatchd: node healthy\n")


@no_nvml_here
@pytest.mark.parametrize("gpu_on_bus", [False, True])
def test_capture_where_nvml_does_not_start_fails_and_its_file_says_why(
    gpu_on_bus: bool, tmp_path: Path
) -> None:
    root = gpu_on_the_bus(tmp_path / "sys") if gpu_on_bus else tmp_path / "sys"
    out = tmp_path / "node.capture.json"
    result = CliRunner().invoke(
        main, ["capture", "--polls", "1", "--sysfs-root", str(root), "--out", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert "Error: no GPU was captured: NVML " in result.stderr
    assert "gpuwatchd run" not in result.stderr  # the daemon's hint, not the capture's
    reason = json.loads(out.read_text())["nvml"]["reason"]
    assert reason in result.stderr
    if gpu_on_bus:
        assert reason.startswith("NVML cannot start (") and "(0000:18:00.0)" in reason
    else:
        assert reason.startswith("NVML could not be loaded (")


@no_nvml_here
@pytest.mark.parametrize("asked", [["--backend", "cuda"], ["--gpu", "0"]])
def test_canary_for_a_gpu_on_a_host_without_any_says_there_is_none_not_install_cupy(
    asked: list[str], tmp_path: Path
) -> None:
    # First-day review N22: the advice was to install the cuda extra.
    root = tmp_path / "sys"
    result = CliRunner().invoke(canary_command, [*asked, "--sysfs-root", str(root)])
    assert result.exit_code == EXIT_CANNOT_RUN, result.output
    assert result.output.startswith(
        f"Error: no GPU to check here: NVML cannot start (NVML Shared Library Not Found) and "
        f"the PCI bus under {root} has no NVIDIA GPU (CUDA: "
    )
    assert "install gpuwatchd's cuda extra" not in result.output
    assert "`--backend cpu` checks the host's cores" in result.output


@no_nvml_here
def test_canary_on_a_host_without_a_gpu_says_no_gpu_was_checked(tmp_path: Path) -> None:
    # First-day review M2: "all 10 canaries passed" and nothing more, as if
    # a GPU had been checked. The host's cores did pass, and that is said too.
    root = tmp_path / "sys"
    result = CliRunner().invoke(canary_command, ["--sysfs-root", str(root)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].endswith("canaries passed")
    assert all(line.split()[0] == "cpu" for line in result.stdout.splitlines()[:-1])
    assert result.stderr.startswith(
        "no GPU was checked, only the host's CPU cores: NVML cannot start (NVML Shared Library "
        f"Not Found) and the PCI bus under {root} has no NVIDIA GPU (CUDA: "
    )
