"""The CLI's layout (issue 23, point 7): one module a command group under
gpuwatchd/cli/, none over 300 lines, so a reader finds each command where
its name says."""

from __future__ import annotations

import importlib
from pathlib import Path

import click

import gpuwatchd.cli
from gpuwatchd.cli import main

MAX_LINES = 300

# Each `gpuwatchd` command: the module under gpuwatchd/cli/ that holds it,
# and its name there.
HOMES = {
    "run": ("run", "run"),
    "status": ("status_and_journal", "status"),
    "journal": ("status_and_journal", "journal"),
    "quarantine": ("quarantine", "quarantine"),
    "canary": ("canary", "canary"),
    "capture": ("capture", "capture"),
    "slurm-healthcheck": ("slurm", "slurm_healthcheck"),
    "report": ("report", "report"),
    "check-config": ("check_config", "check_config"),
}


def test_no_module_of_the_cli_is_over_300_lines() -> None:
    folder = Path(gpuwatchd.cli.__file__).parent
    lengths = {path.name: len(path.read_text().splitlines()) for path in folder.glob("*.py")}
    assert "run.py" in lengths
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_every_command_is_the_one_its_command_group_module_defines() -> None:
    assert sorted(main.commands) == sorted(HOMES)
    for name, (module, attribute) in HOMES.items():
        home = importlib.import_module(f"gpuwatchd.cli.{module}")
        assert main.commands[name] is getattr(home, attribute), name


def test_the_quarantine_subcommands_live_in_the_quarantine_module() -> None:
    group = main.commands["quarantine"]
    assert isinstance(group, click.Group)
    homes = {name: getattr(c.callback, "__module__", None) for name, c in group.commands.items()}
    assert homes == dict.fromkeys(["add", "list", "release"], "gpuwatchd.cli.quarantine")
