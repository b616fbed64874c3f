"""The Containerfile's install, run here: no registry serves its CUDA base
to podman or buildah on this machine, so the steps it runs are tested on a
plain virtual environment instead (scripts/stage-tree, scripts/install-venv,
the BUILD line), and the Containerfile is held to them and to the
DaemonSet."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from actions_support import REPO

from gpuwatchd import __version__

CONTAINERFILE = REPO / "Containerfile"
VENV = "/opt/venvs/gpuwatchd"


def _instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, arguments = line.partition(" ")
            found.append((instruction.upper(), arguments.strip()))
    return found


def _install_command() -> list[str]:
    """The scripts/install-venv command of the Containerfile's RUN steps."""
    for instruction, arguments in _instructions():
        if instruction != "RUN":
            continue
        for command in arguments.split("&&"):
            words = shlex.split(command)
            if words and words[0].endswith("scripts/install-venv"):
                return words
    raise AssertionError("no RUN step of the Containerfile runs scripts/install-venv")


def test_the_image_installs_the_cuda_extra_where_the_packages_put_the_environment() -> None:
    _, destination, tree, extras = _install_command()
    assert (destination, extras) == (VENV, "cuda")
    extras_declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("cupy-cuda12x") for d in extras_declared[extras])
    assert next(a for i, a in _instructions() if i == "COPY") == f". {tree}"


def test_the_image_is_on_a_cuda_runtime_base_and_runs_the_daemon_by_default() -> None:
    instructions = _instructions()
    [base] = [a for i, a in instructions if i == "ARG" and a.startswith("CUDA_BASE=")]
    assert re.fullmatch(r"CUDA_BASE=nvcr\.io/nvidia/cuda:12\.[\d.]+-runtime-\S+", base)
    assert ("ENTRYPOINT", '["gpuwatchd"]') in instructions
    assert ("CMD", '["run", "--config", "/etc/gpuwatchd/gpuwatchd.yaml"]') in instructions
    # The image is only made when its installed command answers.
    assert any(i == "RUN" and "gpuwatchd --version" in a for i, a in instructions)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_images_install_steps_make_an_environment_that_runs_and_names_its_build(
    tmp_path: Path,
) -> None:
    # As the Containerfile: the tree, its BUILD line, scripts/install-venv; the
    # cuda extra left out here (CuPy is a large download, and needs a GPU to run).
    tree = tmp_path / "src"
    stage = [str(REPO / "scripts" / "stage-tree"), str(tree), f"image {__version__}"]
    subprocess.run(stage, check=True, timeout=120, cwd=REPO)
    destination = tmp_path / "venv"
    env = dict(os.environ, PYTHON=sys.executable)
    install = [str(tree / "scripts" / "install-venv"), str(destination), str(tree)]
    subprocess.run(install, check=True, timeout=600, env=env)
    # No pip to change it by hand, no bytecode from the build.
    assert not (destination / "bin" / "pip").exists()
    assert not list(destination.rglob("__pycache__"))
    shown = subprocess.run(
        [str(destination / "bin" / "gpuwatchd"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    ).stdout
    version = re.escape(__version__)
    assert re.fullmatch(rf"gpuwatchd {version} \(image {version}, git \w+.*\)\n", shown), shown
