"""The `gpuwatchd` command: the group (entry.py) and, one module a command
group, the commands added to it here: run the daemon, show a node's status
and journal, quarantine and release by hand, the canaries, a capture of the
node's answers, Slurm's health check, the evidence bundle for a vendor's
ticket (report), and check-config."""

from __future__ import annotations

from gpuwatchd.cli import (
    canary,
    capture,
    check_config,
    quarantine,
    report,
    run,
    slurm,
    status_and_journal,
)
from gpuwatchd.cli.entry import main

# `gpuwatchd.cli:main`, the console script (pyproject.toml) and `python -m gpuwatchd`.
__all__ = ["main"]

main.add_command(run.run)
main.add_command(status_and_journal.status)
main.add_command(status_and_journal.journal)
main.add_command(quarantine.quarantine)
main.add_command(canary.canary)
main.add_command(capture.capture)
main.add_command(slurm.slurm_healthcheck)
main.add_command(report.report)
main.add_command(check_config.check_config)
