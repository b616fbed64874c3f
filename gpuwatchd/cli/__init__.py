"""The `gpuwatchd` command: run the daemon, show a node's status, check a
config, quarantine and release by hand, Slurm's health check, and the
evidence bundle for a vendor's ticket (report)."""

from __future__ import annotations

import functools
import logging
from contextlib import ExitStack

import click

from gpuwatchd import logs
from gpuwatchd import report as reports
from gpuwatchd.actions.client import (
    Offline,
)
from gpuwatchd.assemble import simulated_canary_node
from gpuwatchd.canary.cli import canary_command
from gpuwatchd.canary.wire import to_wire
from gpuwatchd.cli import capture, check_config, quarantine, run, slurm, status_and_journal
from gpuwatchd.cli.capture import node_to_read
from gpuwatchd.cli.common import (
    config_option,
    read_config,
    state_dir_option,
)
from gpuwatchd.cli.entry import main
from gpuwatchd.cli.target import (
    Target,
    daemon_client,
    daemon_or_database,
    resolve_target,
)
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import (
    Config,
)
from gpuwatchd.dcgm import DcgmRun
from gpuwatchd.dcgm.tier import DcgmHost, run_tier
from gpuwatchd.redact import redactions
from gpuwatchd.server import (
    DCGM_RUNS,
)

# `gpuwatchd.cli:main`, the console script (pyproject.toml) and `python -m gpuwatchd`.
__all__ = ["main"]

log = logging.getLogger("gpuwatchd")


@main.command()
@click.argument("subject")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="Write the archive here (default: gpuwatchd-report-<subject>-<time>.tar.gz in the "
    "current directory).",
)
@click.option(
    "--anonymize",
    is_flag=True,
    help="Replace GPU UUIDs, serial numbers and HCA node GUIDs with pseudonyms (tokens, "
    "secrets and host names are left out of every bundle).",
)
@click.option(
    "--simulate",
    "simulated",
    metavar="SCENARIO",
    help="Capture a simulated node's answers (a scenario file or built-in name): a report "
    "on a simulated daemon's state.",
)
@config_option()
@state_dir_option("State directory read when the local daemon is not running.")
def report(
    subject: str,
    out: str | None,
    anonymize: bool,
    simulated: str | None,
    config_path: str | None,
    state_dir: str | None,
) -> None:
    """One archive for a vendor ticket about SUBJECT (gpu:N, gpu:<UUID> of a
    board gone too, node, nvlink:N/L, ib:DEVICE/PORT): its journal, status,
    identity, canary evidence and DCGM runs, and a capture of the node's
    answers. From this node's daemon through its API while it runs, else
    from its state database; tokens, secrets and host names are left out.
    There is no --node: the capture and the identity are this node's."""
    target = resolve_target(None, config_path, None, state_dir)

    def missing(database: str) -> reports.Held:
        raise click.ClickException(
            f"gpuwatchd is not running here and there is no {database}: nothing is recorded "
            f"about {subject}"
        )

    try:
        held = daemon_or_database(
            target,
            lambda: reports.from_daemon(target.client, subject),
            lambda offline: reports.from_database(offline, subject),
            missing,
            writes=False,
        )
    except ValueError as error:  # the daemon's answer names no such subject
        raise click.ClickException(str(error)) from error
    # What reading the node says at info (every NVML refusal) is the
    # capture's to record, not the report's to print.
    logs.setup("warning", journal=False)
    clock = SystemClock()
    with ExitStack() as stack:
        config, before_poll = node_to_read(stack, target.config, clock, simulated)
        hidden = redactions(target.config, target.token_file)
        bundle = reports.build(held, config, clock, hidden, anonymize, before_poll)
    path = out or reports.default_path(bundle)
    reports.write(bundle, path)
    click.echo(f"wrote {path} ({reports.summary(bundle)})")


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
