"""The API's Unix socket (`api.listen: unix:PATH`): the daemon never removes
a path it did not make in this run. The live socket of another process, a
regular file, a symbolic link (dangling or not), a FIFO or a directory at
PATH is refused with a message and left exactly as it was; at stop only the
socket this listener bound is removed (review adversarial-2, N2: rows 271,
274-278)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest
from actions_support import free_port, write_config
from click.testing import CliRunner
from daemon_support import SimulatedDaemon, simulated_daemon

from gpuwatchd.actions.client import DaemonClient
from gpuwatchd.cli import main
from gpuwatchd.server import UnixStatusServer

SCENARIO = "node: {gpus: 2, nvlinks: 2, hcas: 1}\nfaults: []\n"
KEEP = "keep me"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatedDaemon]:
    with simulated_daemon(SCENARIO, tmp_path_factory.mktemp("unix")) as running:
        running.run_until(20)
        yield running


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # A short directory: a Unix socket's path is at most 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def _listener(sim: SimulatedDaemon, path: Path) -> UnixStatusServer:
    server = UnixStatusServer(
        str(path), sim.daemon.metrics, lambda: sim.daemon.snapshot, 60.0, sim.clock.now
    )
    server.start()
    return server


def _victim(run_dir: Path) -> Path:
    victim = run_dir / "victim"
    victim.write_text(KEEP)
    victim.chmod(0o600)
    return victim


def _file(path: Path, run_dir: Path) -> None:
    path.write_text(KEEP)
    path.chmod(0o600)


def _symlink(path: Path, run_dir: Path) -> None:
    path.symlink_to(_victim(run_dir))


def _dangling_symlink(path: Path, run_dir: Path) -> None:
    path.symlink_to(run_dir / "nothing-here")


def _fifo(path: Path, run_dir: Path) -> None:
    os.mkfifo(path, 0o600)


def _directory(path: Path, run_dir: Path) -> None:
    path.mkdir(mode=0o700)


PLACES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "regular file": (_file, "a regular file"),
    "symlink to a 0600 file": (_symlink, "a symbolic link"),
    "dangling symlink": (_dangling_symlink, "a symbolic link"),
    "fifo": (_fifo, "a FIFO"),
    "directory": (_directory, "a directory"),
}


def _as_it_is(path: Path, run_dir: Path) -> tuple[object, ...]:
    """What is at `path` and at the victim a symlink points to: kind,
    identity, mode, link target and content."""
    found = os.lstat(path)
    target = os.readlink(path) if stat.S_ISLNK(found.st_mode) else None
    content = path.read_text() if stat.S_ISREG(found.st_mode) else None
    victim = run_dir / "victim"
    victim_seen = (victim.stat().st_mode, victim.read_text()) if victim.exists() else None
    return found.st_mode, found.st_ino, found.st_dev, target, content, victim_seen


def _run(config: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", "--config", str(config), "--simulate", "calm"])
    return result.exit_code, result.output


def _config(tmp_path: Path, socket_path: Path) -> Path:
    return write_config(
        tmp_path / "gpuwatchd.yaml",
        tmp_path / "state",
        free_port(),
        {"api": {"listen": f"unix:{socket_path}"}},
    )


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_daemon_told_to_listen_where_something_else_is_refuses_and_leaves_it(
    place: str, tmp_path: Path, run_dir: Path
) -> None:
    # Rows 274, 275, 277, 278 (276: a directory): the thing left as it was,
    # a symlink's target not chmodded, and nothing started (no state written).
    path = run_dir / "api.sock"
    make, kind = PLACES[place]
    make(path, run_dir)
    before = _as_it_is(path, run_dir)
    code, output = _run(_config(tmp_path, path))
    assert code == 1
    assert f"cannot listen on unix:{path}: {path} exists and is {kind}, not a socket" in output
    assert "Traceback" not in output
    assert _as_it_is(path, run_dir) == before
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_listener_refused_its_path_removes_nothing(
    place: str, sim: SimulatedDaemon, run_dir: Path
) -> None:
    # The listener's own bind decides too (something may come between the
    # daemon's check and its bind): its refusal closes it, removing nothing.
    path = run_dir / "api.sock"
    make, kind = PLACES[place]
    make(path, run_dir)
    before = _as_it_is(path, run_dir)
    with pytest.raises(OSError, match=f"exists and is {kind}, not a socket: left as it is"):
        _listener(sim, path)
    assert _as_it_is(path, run_dir) == before


def test_a_second_daemon_on_a_live_socket_is_refused_and_the_first_keeps_it(
    sim: SimulatedDaemon, tmp_path: Path, run_dir: Path
) -> None:
    # Row 271: the second refused with a message; the first keeps its socket.
    path = run_dir / "api.sock"
    first = _listener(sim, path)
    try:
        before = _as_it_is(path, run_dir)
        code, output = _run(_config(tmp_path, path))
        assert code == 1
        assert f"cannot listen on unix:{path}: another process listens on {path}" in output
        with pytest.raises(OSError, match="another process listens"):
            _listener(sim, path)
        assert _as_it_is(path, run_dir) == before
        assert DaemonClient(f"unix:{path}").get("/api/v1/status")["polls"] > 0
    finally:
        first.stop()
    assert not path.exists()


def test_at_stop_a_listener_removes_only_the_socket_it_bound(
    sim: SimulatedDaemon, run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = run_dir / "api.sock"
    first = _listener(sim, path)
    # Someone removes the socket and another process listens there now.
    path.unlink()
    with closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as other:
        other.bind(str(path))
        other.listen(1)
        theirs = _as_it_is(path, run_dir)
        with caplog.at_level(logging.WARNING, logger="gpuwatchd.server"):
            first.stop()
        assert _as_it_is(path, run_dir) == theirs
    assert f"{path} is no longer the socket this daemon bound: left as it is" in caplog.text
