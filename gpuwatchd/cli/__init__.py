"""The `gpuwatchd` command: run the daemon, show a node's status, check a
config, quarantine and release by hand, Slurm's health check, and the
evidence bundle for a vendor's ticket (report)."""

from __future__ import annotations

import functools
import logging

from gpuwatchd.actions.client import (
    Offline,
)
from gpuwatchd.assemble import simulated_canary_node
from gpuwatchd.canary.cli import canary_command
from gpuwatchd.canary.wire import to_wire
from gpuwatchd.cli import (
    capture,
    check_config,
    quarantine,
    report,
    run,
    slurm,
    status_and_journal,
)
from gpuwatchd.cli.common import (
    read_config,
)
from gpuwatchd.cli.entry import main
from gpuwatchd.cli.target import (
    Target,
    daemon_client,
    daemon_or_database,
)
from gpuwatchd.config import (
    Config,
)
from gpuwatchd.dcgm import DcgmRun
from gpuwatchd.dcgm.tier import DcgmHost, run_tier
from gpuwatchd.server import (
    DCGM_RUNS,
)

# `gpuwatchd.cli:main`, the console script (pyproject.toml) and `python -m gpuwatchd`.
__all__ = ["main"]

log = logging.getLogger("gpuwatchd")


def _record_dcgm(config: Config, run: DcgmRun) -> str:
    """Where `canary --dcgm` keeps a run: through the daemon, which holds the
    state database while it runs, else in the database."""
    target = Target(
        config, daemon_client(config, None), False, config.token_file, config.daemon.state_dir
    )

    def remote() -> str:
        answer = target.client.send("POST", DCGM_RUNS, to_wire(run), target.secret())
        return f"recorded by the daemon at {target.client.url} (run {answer['id']})"

    def local(offline: Offline) -> str:
        return f"recorded in {offline.store.path} (run {offline.record_dcgm(run)})"

    return daemon_or_database(target, remote, local)


# The canaries' one-shot command, with the simulated node the assembly
# describes and the DCGM tier recording through this command's config.
canary = canary_command(
    simulated_canary_node, functools.partial(run_tier, DcgmHost(read_config, _record_dcgm))
)
main.add_command(canary)
main.add_command(run.run)
main.add_command(status_and_journal.status)
main.add_command(status_and_journal.journal)
main.add_command(check_config.check_config)
main.add_command(quarantine.quarantine)
main.add_command(capture.capture)
main.add_command(slurm.slurm_healthcheck)
main.add_command(report.report)
