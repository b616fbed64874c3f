"""Every code block of README.md, run as its reader would run it, so that the
README cannot rot: the Quick start's daemon and the commands the README has
one type in another terminal, the scenario file, the demo stack. A block the
test does not know fails the test until it is run here or said why not.

The one change made to what the README says: the daemon listens on a free
port instead of 9477 (the machine may run another), and the blocks are given
that port, through the export line the daemon prints."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from actions_support import REPO, answers, free_port, wait_for
from daemon_support import simulated_daemon

from gpuwatchd.config import load_config
from gpuwatchd.policy import PolicyConfig

README = REPO / "README.md"
README_PORT = "9477"


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int

    @property
    def first(self) -> str:
        return self.text.splitlines()[0]


def _blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
    ]


# Each block by its first line: run by the named test, or why it is not run here.
QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/gpuwatchd run --simulate"
)
EXPORT_SAMPLE = "# for gpuwatchd commands in another terminal"
ANOTHER_TERMINAL = (
    ". .venv/bin/activate",
    "gpuwatchd quarantine add gpu:3",
    "curl -s http://127.0.0.1:9477/api/v1/status",
)
SCENARIO = "node: {gpus: 8"
DEMO_STACK = "./scripts/demo-stack"
NOT_RUN = {
    "./scripts/test": "it is the suite this test is part of",
    "scripts/build-deb": "installs as root into /opt, /etc, systemd: scripts/check-packages",
    "kubectl apply -k": "needs a cluster: tests/test_deploy_manifests.py renders the base",
    ".venv/bin/python bench/run.py": "a benchmark; tests/test_bench_run.py runs its --quick mode",
    "# slurm.conf: Epilog=": "needs DCGM and Slurm; tests/test_dcgm.py runs `canary --dcgm` "
    "against a fake dcgmi, for each exit status",
    "# A maintenance window": "needs DCGM; tests/test_dcgm.py and tests/test_report.py run "
    "`canary --dcgm` and `report` on a simulated node",
}


def _kind(block: Block) -> str:
    known = [QUICK_START, EXPORT_SAMPLE, *ANOTHER_TERMINAL, SCENARIO, DEMO_STACK, *NOT_RUN]
    kinds = [prefix for prefix in known if block.first.startswith(prefix)]
    assert kinds, f"README.md:{block.line}: a block this test does not run: {block.first!r}"
    return kinds[0]


def test_every_readme_block_is_run_here_or_says_why_not() -> None:
    kinds = [_kind(block) for block in _blocks()]
    for expected in (QUICK_START, EXPORT_SAMPLE, *ANOTHER_TERMINAL, SCENARIO, DEMO_STACK):
        assert kinds.count(expected) == 1, expected


def _of(kind: str) -> Block:
    return next(block for block in _blocks() if _kind(block) == kind)


def _stderr_lines(process: subprocess.Popen[str]) -> Iterator[str]:
    assert process.stderr is not None
    yield from iter(process.stderr.readline, "")


def _exported(lines: Iterator[str]) -> dict[str, str]:
    comment, export = _of(EXPORT_SAMPLE).text.splitlines()
    for line in lines:
        if line.startswith(EXPORT_SAMPLE):
            assert line.rstrip("\n") == comment, "the README's comment differs from the daemon's"
            printed = next(lines)
            assert printed.startswith(export.split("=")[0] + "="), printed
            words = printed.split()[1:]
            return dict(word.split("=", 1) for word in words)
    raise AssertionError("the simulated daemon printed no export line")


def _drain(lines: Iterator[str]) -> None:
    """Read the daemon's log on, so that it never blocks on a full pipe."""
    threading.Thread(target=lambda: [None for _ in lines], daemon=True).start()


@contextmanager
def _quick_start_daemon(
    command: list[str], cwd: Path, through_shell: bool = False
) -> Iterator[tuple[str, dict[str, str]]]:
    """The Quick start's daemon, on a free port; its port and exported
    variables. Run directly, it must stop cleanly on SIGTERM (a shell in
    between dies of the signal itself)."""
    port = str(free_port())
    process = subprocess.Popen(
        [*command, "--listen", f"127.0.0.1:{port}"],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        lines = _stderr_lines(process)
        exported = _exported(lines)
        _drain(lines)
        url = f"http://127.0.0.1:{port}"
        assert exported["GPUWATCHD_NODE"] == url
        wait_for(lambda: answers(f"{url}/healthz"), "the daemon's first poll", timeout=60)
        yield port, exported
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        returncode = process.wait(timeout=30)
        assert returncode == (-signal.SIGTERM if through_shell else 0)


SEPARATOR = "---- next README block ----"


def _run_session(blocks: list[Block], port: str, exported: dict[str, str]) -> list[str]:
    """The blocks one after the other in one shell, as typed into one terminal
    (what the first sets up, the others use); the output of each."""
    script = f"\necho '{SEPARATOR}'\n".join(block.text for block in blocks)
    script = script.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}")
    result = subprocess.run(
        ["sh", "-e", "-c", script],
        cwd=REPO,
        env={**os.environ, **exported},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = ", ".join(f"README.md:{block.line}" for block in blocks)
    assert result.returncode == 0, f"{lines}:\n{result.stdout}\n{result.stderr}"
    return result.stdout.split(f"{SEPARATOR}\n")


def test_the_blocks_for_another_terminal_work_as_written_against_the_quick_start_daemon() -> None:
    command = [sys.executable, "-m", "gpuwatchd", "run", "--simulate", "--interval", "1s"]
    with _quick_start_daemon(command, REPO) as (port, exported):
        quick, by_hand, api = _run_session([_of(k) for k in ANOTHER_TERMINAL], port, exported)
    assert "quarantined gpu:3: fans at 100%, ticket 4711" in quick
    assert (
        'gpuwatchd_quarantined{fault_code="",reason="operator",source="manual",subject="gpu:3"}'
        in quick
    )
    # The node too, as the README says after the block (first-day review N19).
    assert 'reason="gpu_quarantine_ratio",source="auto",subject="node"} 1.0' in quick
    assert "gpu:3 was already quarantined" in by_hand and "released gpu:3: fan replaced" in by_hand
    assert "quarantined gpu:5: RMA" in by_hand
    assert '"subject": "gpu:6"' in api and '"quarantine"' in api


def test_the_readme_scenario_file_runs_on_a_simulated_node(tmp_path: Path) -> None:
    with simulated_daemon(_of(SCENARIO).text, tmp_path) as sim:
        snapshot = sim.run_until(60)
    assert snapshot.quarantines and any(q.subject == "gpu:1" for q in snapshot.quarantines)


def _tracked_copy(destination: Path) -> None:
    """The checkout as a fresh clone has it (tracked files, and new ones not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)


@pytest.mark.slow
def test_the_quick_start_one_liner_works_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "gpuwatchd"
    _tracked_copy(clone)
    # The block as written, run by sh, with the port appended to its last command.
    command = ["sh", "-c", _of(QUICK_START).text.strip() + ' "$@"', "sh"]
    with _quick_start_daemon(command, clone, through_shell=True) as (port, _):
        assert answers(f"http://127.0.0.1:{port}/metrics")
    assert (clone / ".venv" / "bin" / "gpuwatchd").exists()


def _free_base_port(span: int = 20) -> int:
    """A base port with `span` free ports above it (the demo stack uses them)."""
    for _ in range(50):
        base = free_port()
        if base + span > 65535:
            continue
        if all(_free(port) for port in range(base, base + span)):
            return base
    raise AssertionError("no free range of ports")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_for_line(lines: Iterator[str], wanted: Callable[[str], bool]) -> list[str]:
    seen = []
    for line in lines:
        seen.append(line)
        if wanted(line):
            return seen
    raise AssertionError("".join(seen))


@pytest.mark.slow
def test_the_demo_stack_starts_as_the_readme_says_and_stops_on_ctrl_c() -> None:
    script = _of(DEMO_STACK).first.split("#")[0].split()
    process = subprocess.Popen(
        [*script, "--base-port", str(_free_base_port())],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        lines = iter(process.stdout.readline, "")
        started = _wait_for_line(lines, lambda line: "Ctrl-C stops everything" in line)
        assert any(line.startswith("Prometheus ") for line in started)
        workdir = Path(started[-1].split("configs and logs in ")[1].split(";")[0])
        assert workdir.is_dir()
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=120) == 0
        assert not workdir.exists()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def test_the_readme_says_one_gpu_quarantined_takes_the_node_at_the_default_ratio() -> None:
    ratio = PolicyConfig().node_quarantine_ratio
    text = " ".join(README.read_text().split())
    assert f"once one GPU in {round(1 / ratio)} is (`policy.node_quarantine_ratio: {ratio:g}`)" in (
        text
    )
    assert "# and so the node: see below" in _of(ANOTHER_TERMINAL[0]).text


def _installed_by_the_test_script() -> list[str]:
    """The Debian packages scripts/test installs and the test extra's packages."""
    script = (REPO / "scripts" / "test").read_text()
    debs = re.findall(r"debs\+=\(([\w.-]+)\)", script)
    with (REPO / "pyproject.toml").open("rb") as stream:
        extra = tomllib.load(stream)["project"]["optional-dependencies"]["test"]
    return [*debs, *(re.split(r"[<>=!~\[ ]", requirement)[0] for requirement in extra)]


def test_the_readme_names_every_package_the_test_command_installs() -> None:
    # First-day review N15: it named three of the Debian packages.
    installed = _installed_by_the_test_script()
    assert "victoria-metrics" in installed and "kubernetes-validate" in installed
    text = README.read_text()
    assert [name for name in installed if f"`{name}`" not in text] == []


def test_the_readme_status_says_no_real_gpu_while_every_capture_is_of_the_fake() -> None:
    # Issue 23, point 5: the README says plainly what has met real hardware.
    # A real node's capture in tests/fixtures/ (not named -fake) makes the
    # status line untrue: then the section is to be rewritten with it.
    captures = sorted((REPO / "tests" / "fixtures").glob("*.capture.json"))
    real = [path.name for path in captures if "-fake." not in path.name]
    never = "**No part of gpuwatchd has yet run against a real NVIDIA driver or GPU.**"
    assert (never in README.read_text()) == (not real), real


def test_the_pilot_runs_on_what_it_names(tmp_path: Path) -> None:
    text = " ".join(README.read_text().split())
    pilot = text.split("## Pilot: before it decides anything", 1)[1].split("## Install", 1)[0]
    assert "`policy.dry_run: true`" in pilot
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("policy:\n  dry_run: true\n")
    assert load_config(str(config)).policy.dry_run is True
    assert '`gpuwatchd capture --anonymize --out "$(hostname -s).capture.json"`' in pilot
    assert "`gpuwatchd run --simulate NODE.capture.json`" in pilot
    assert (REPO / "scripts" / "sdc-gpu-check.py").exists()
    assert "(#pilot-before-it-decides-anything)" in text


# Words of a project's internal notes, not of its docs: who wrote a page and
# how (issue 23, point 5: "the project's docs speak of the project").
NOTES_VOICE = re.compile(
    r"\b(?:sessions?|helpers?|engineers?|reviewers?|the lead|this change|this branch)\b"
    r"|shared/reviews|\b(?:the )?review (?:rows?|adversarial|first-day|[A-F]\d)",
    re.IGNORECASE,
)


def test_the_docs_speak_of_the_project_not_of_who_wrote_them() -> None:
    pages = [README, REPO / "CHANGELOG.md", REPO / "bench" / "RESULTS.md"]
    pages += sorted((REPO / "docs").glob("*.md"))
    said = [
        f"{page.relative_to(REPO)}:{number}: {found[0]}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if (found := NOTES_VOICE.search(line))
    ]
    assert said == []
