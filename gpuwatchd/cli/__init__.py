"""The `gpuwatchd` command: run the daemon, show a node's status, check a
config, quarantine and release by hand, Slurm's health check, and the
evidence bundle for a vendor's ticket (report)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import time
from contextlib import ExitStack
from typing import Any

import click

from gpuwatchd import logs
from gpuwatchd import report as reports
from gpuwatchd.actions.client import (
    DaemonDown,
    DaemonError,
    DaemonUnreachable,
    Offline,
)
from gpuwatchd.assemble import simulated_canary_node
from gpuwatchd.canary.cli import canary_command
from gpuwatchd.canary.wire import to_wire
from gpuwatchd.cli import capture, check_config, quarantine, run, status_and_journal
from gpuwatchd.cli.capture import node_to_read
from gpuwatchd.cli.common import (
    config_option,
    duration_value,
    node_option,
    read_config,
    state_dir_option,
)
from gpuwatchd.cli.entry import main
from gpuwatchd.cli.target import (
    Neither,
    Target,
    daemon_client,
    daemon_or_database,
    offline_database,
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
from gpuwatchd.store import DB_NAME, LOCK_WAIT_SECONDS
from gpuwatchd.units import format_duration

# `gpuwatchd.cli:main`, the console script (pyproject.toml) and `python -m gpuwatchd`.
__all__ = ["main"]

log = logging.getLogger("gpuwatchd")


# Node health that takes the node out of Slurm: `unknown` is a node whose
# every source is down, so nothing says it is well.
UNFIT = ("unhealthy", "quarantined", "unknown")
# A verdict from the state database older than this many poll intervals is
# no verdict: the daemon that wrote it is down.
STALE_POLLS = 3


@main.command("slurm-healthcheck")
@node_option("URL of the daemon (default: the local one).")
@config_option()
@state_dir_option("State directory (default: the config's daemon.state_dir).")
@click.option(
    "--timeout",
    callback=duration_value,
    default="2s",
    show_default=True,
    help="Wait this long for the daemon, then read the state database.",
)
@click.option(
    "--fail-open",
    is_flag=True,
    help="Pass (exit 0, with a warning) when the daemon is down and its last poll is stale.",
)
def slurm_healthcheck(
    node_url: str | None,
    config_path: str | None,
    state_dir: str | None,
    timeout: float,
    fail_open: bool,
) -> None:
    """Exit 1 with a one-line reason when the node is unhealthy, quarantined or
    its health is unknown.

    For a Slurm Prolog (a failing prolog drains the node and requeues the job)
    or NHC's check_cmd_status. Asks the local daemon; when it is not running,
    or does not answer within --timeout, reads its state database instead (the
    health it last saved, and the quarantines). A saved verdict older than
    three poll intervals fails too (the daemon is down: nothing watches the
    node), unless --fail-open. With neither daemon nor database there is no
    verdict on the node: that exits 0 with a warning.
    """
    target = resolve_target(node_url, config_path, None, state_dir, timeout)

    def remote() -> tuple[str, str]:
        document = target.client.get("/api/v1/status")
        findings = [
            f"{s['subject']} {f['message']}"
            for s in document["subjects"]
            if s["state"] in UNFIT
            for f in s["findings"]
        ]
        return document["node"]["health"], _why(document["quarantines"], findings)

    database = os.path.join(target.state_dir, DB_NAME)
    try:
        health, why = remote()
    except (DaemonUnreachable, DaemonError) as error:
        if target.explicit or not os.path.exists(database):
            click.echo(
                f"gpuwatchd: no verdict ({_no_answer(error)}, no state database at {database})"
            )
            return
        # A daemon that answered nothing in time still holds its database:
        # no wait for it then.
        wait = LOCK_WAIT_SECONDS if isinstance(error, DaemonDown) else 0.0
        try:
            with offline_database(target, wait) as offline:
                saved = offline.node_verdict()
        except Neither as neither:
            click.echo(f"gpuwatchd: no verdict ({_no_answer(error)}; {neither.message})")
            return
        health = saved.health
        why = _why([dataclasses.asdict(q) for q in saved.quarantines], [])
        if not isinstance(error, DaemonDown):
            click.echo(f"gpuwatchd: {_no_answer(error)}; the state database says:", err=True)
        if health not in UNFIT:
            _fail_if_stale(saved.last_poll, target.config.daemon.poll_interval, fail_open)
    if health in UNFIT:
        click.echo(f"gpuwatchd: node {health}: {why}")
        sys.exit(1)
    click.echo(f"gpuwatchd: node {health}")


def _fail_if_stale(last_poll: float | None, interval: float, fail_open: bool) -> None:
    """Exit 1 when the saved verdict is older than STALE_POLLS poll intervals
    (or there is none): the daemon is down and nothing watches the node."""
    age = None if last_poll is None else time.time() - last_poll
    if age is not None and age <= STALE_POLLS * interval:
        return
    when = "never" if age is None else f"{format_duration(age)} ago"
    why = (
        f"the daemon is not running and last polled {when} (more than {STALE_POLLS} poll "
        "intervals): nothing watches this node"
    )
    if fail_open:
        click.echo(f"gpuwatchd: {why}; passing (--fail-open)", err=True)
        return
    click.echo(f"gpuwatchd: node unknown: {why}")
    sys.exit(1)


def _no_answer(error: Exception) -> str:
    if isinstance(error, DaemonDown):
        return "not running"
    return f"the daemon did not answer: {error}"


def _why(quarantines: list[dict[str, Any]], findings: list[str]) -> str:
    live = [f"{q['subject']} {q['reason']}" for q in quarantines if not q["dry_run"]]
    return "; ".join(live or findings) or "see `gpuwatchd status`"


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
