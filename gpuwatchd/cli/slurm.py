"""`gpuwatchd slurm-healthcheck`: the node's verdict for a Slurm Prolog or
NHC, exit 1 with a one-line reason, from the daemon or, when it does not
answer, from its state database (a stale verdict fails unless --fail-open)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import click

from gpuwatchd.actions.client import DaemonDown, DaemonError, DaemonUnreachable
from gpuwatchd.cli.common import config_option, duration_value, node_option, state_dir_option
from gpuwatchd.cli.target import Neither, offline_database, resolve_target
from gpuwatchd.store import DB_NAME, LOCK_WAIT_SECONDS
from gpuwatchd.units import format_duration

# Node health that takes the node out of Slurm: `unknown` is a node whose
# every source is down, so nothing says it is well.
UNFIT = ("unhealthy", "quarantined", "unknown")
# A verdict from the state database older than this many poll intervals is
# no verdict: the daemon that wrote it is down.
STALE_POLLS = 3


@click.command("slurm-healthcheck")
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
