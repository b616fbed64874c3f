"""Which build of gpuwatchd this is, for `gpuwatchd --version` and the log.

A package build (scripts/build-deb, scripts/build-rpm, the Containerfile)
writes BUILD beside this module: what was built (deb 0.2.0-1, rpm 0.2.0-1,
image) and the git commit it was built from. Run from a git checkout
(`pip install -e .`) there is no such file, and the checkout's commit is
asked of git. Anything else (a wheel built from a source tree) says the
build is not known rather than guess.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from gpuwatchd import __version__

PACKAGE_DIR = Path(__file__).parent
BUILD_FILE_NAME = "BUILD"
# git answers in milliseconds; a hung filesystem must not hang --version.
GIT_TIMEOUT_SECONDS = 5.0


@functools.cache
def build(package_dir: Path = PACKAGE_DIR) -> str:
    """What the gpuwatchd package in `package_dir` was built as: its BUILD
    file's line, `git <commit>` (with `, modified` for uncommitted changes
    to tracked files) from a checkout, or `build unknown`."""
    try:
        recorded = (package_dir / BUILD_FILE_NAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        recorded = ""
    return recorded or checkout_commit(package_dir) or "build unknown"


def describe() -> str:
    """`0.2.0 (deb 0.2.0-1, git 0bb4e5f1a2b3)`: the version and its build."""
    return f"{__version__} ({build()})"


def checkout_commit(directory: Path = PACKAGE_DIR) -> str | None:
    """`git <commit>` of the checkout whose gpuwatchd/ `directory` is, or
    None when it is none (or git is missing). A package installed into a
    virtual environment inside some other checkout is not tracked there,
    so that checkout's commit is not taken for its build."""
    if _git(directory, "ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    commit = _git(directory, "rev-parse", "--short=12", "HEAD")
    if commit is None:
        return None
    changes = _git(directory, "status", "--porcelain", "--untracked-files=no")
    return f"git {commit}, modified" if changes else f"git {commit}"


def _git(directory: Path, *arguments: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(directory), *arguments],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


if __name__ == "__main__":
    # What a package build records (scripts/build-deb, scripts/build-rpm).
    print(checkout_commit() or "git commit unknown")
