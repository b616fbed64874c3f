"""`gpuwatchd --version` names the build: a package's BUILD file, a
checkout's git commit, or that the build is not known; and the version is
the same wherever the packaging states it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from actions_support import REPO
from click.testing import CliRunner
from daemon_support import simulated_daemon

from gpuwatchd import __version__, version
from gpuwatchd.cli import main

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _package_copy(root: Path) -> Path:
    package = root / "gpuwatchd"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.2.0"\n')
    return package


def _git(directory: Path, *arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(directory), *arguments],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_a_package_build_is_named_by_its_build_file(tmp_path: Path) -> None:
    package = _package_copy(tmp_path)
    (package / version.BUILD_FILE_NAME).write_text("deb 0.2.0-1, git 0bb4e5ff5eb4\n")
    assert version.build(package) == "deb 0.2.0-1, git 0bb4e5ff5eb4"


@needs_git
def test_a_checkout_is_named_by_its_commit_and_says_when_it_was_changed(tmp_path: Path) -> None:
    package = _package_copy(tmp_path / "checkout")
    _git(tmp_path / "checkout", "init", "-q")
    _git(tmp_path / "checkout", "add", ".")
    identity = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    _git(tmp_path / "checkout", *identity, "commit", "-q", "-m", "first")
    commit = _git(tmp_path / "checkout", "rev-parse", "--short=12", "HEAD")
    assert version.checkout_commit(package) == f"git {commit}"
    (package / "__init__.py").write_text('__version__ = "0.2.1"\n')
    assert version.checkout_commit(package) == f"git {commit}, modified"


@needs_git
def test_a_package_in_a_virtual_environment_inside_another_checkout_takes_not_its_commit(
    tmp_path: Path,
) -> None:
    _git(tmp_path, "init", "-q")
    identity = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    _git(tmp_path, *identity, "commit", "-q", "--allow-empty", "-m", "someone else's")
    package = _package_copy(tmp_path / ".venv" / "lib" / "site-packages")
    assert version.build(package) == "build unknown"


def test_an_installed_tree_without_build_file_or_checkout_is_an_unknown_build(
    tmp_path: Path,
) -> None:
    assert version.build(_package_copy(tmp_path)) == "build unknown"


def test_version_flag_names_the_version_and_the_build() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"gpuwatchd {__version__} ({version.build()})\n"


def test_the_metrics_name_the_build_for_a_fleet_to_track_its_rollout(tmp_path: Path) -> None:
    with simulated_daemon("node: {gpus: 1, nvlinks: 0, hcas: 0}\n", tmp_path) as sim:
        sim.daemon.step()
        page, _ = sim.daemon.metrics.render("")
    [line] = [row for row in page.decode().splitlines() if row.startswith("gpuwatchd_build_info")]
    assert f'version="{__version__}"' in line
    assert f'build="{version.build()}"' in line


@needs_git
def test_this_checkout_shows_its_own_commit() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not run from a git checkout")
    head = _git(REPO, "rev-parse", "--short=12", "HEAD")
    shown = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert re.fullmatch(rf"gpuwatchd {re.escape(__version__)} \(git {head}(, modified)?\)\n", shown)


def test_the_debian_changelog_is_at_the_package_version() -> None:
    first = (REPO / "debian" / "changelog").read_text().splitlines()[0]
    match = re.fullmatch(r"gpuwatchd \(([^)-]+)-\d+\) \S+; urgency=\w+", first)
    assert match, first
    assert match.group(1) == __version__


def test_the_changelog_has_an_entry_for_the_package_version() -> None:
    headings = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert __version__ in headings, headings[:3]
