"""`gpuwatchd report`: one archive for a vendor ticket about a subject,
what the daemon (or its state database) holds on it and a capture of this
node's answers, with tokens, secrets and host names left out."""

from __future__ import annotations

from contextlib import ExitStack

import click

from gpuwatchd import logs
from gpuwatchd import report as reports
from gpuwatchd.cli.capture import node_to_read
from gpuwatchd.cli.common import config_option, state_dir_option
from gpuwatchd.cli.target import daemon_or_database, resolve_target
from gpuwatchd.clock import SystemClock
from gpuwatchd.redact import redactions


@click.command()
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
