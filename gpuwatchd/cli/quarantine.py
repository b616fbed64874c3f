"""`gpuwatchd quarantine add|release|list`: quarantines by hand, through the
daemon's API with its token, or in its state database when the local
daemon is not running."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from gpuwatchd.actions.client import DaemonError, Offline, subject_path
from gpuwatchd.actions.manual import check_text, local_operator
from gpuwatchd.cli.target import daemon_or_database, resolve_target, target_options
from gpuwatchd.policy import NODE
from gpuwatchd.status import format_time, render_quarantines


@click.group()
def quarantine() -> None:
    """Quarantine and release subjects by hand, and list quarantines.

    SUBJECT is node, gpu:N, gpu:<UUID>, nvlink:N/L or ib:DEVICE/PORT. Changes
    go through the daemon's API (with the token file's token) and take effect at
    once; when the local daemon is not running they are written to its state
    database, where it finds them when it starts.
    """


@quarantine.command("add")
@click.argument("subject")
@click.option("--reason", required=True, help="Why, for the journal and the scheduler.")
@target_options
def quarantine_add(
    subject: str,
    reason: str,
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
) -> None:
    """Quarantine SUBJECT."""
    target = resolve_target(node_url, config_path, token_file, state_dir)
    operator = local_operator()

    def remote() -> tuple[dict[str, Any] | None, dict[str, Any]]:
        body = {"subject": subject, "reason": reason, "operator": operator}
        document = target.client.send("POST", "/api/v1/quarantines", body, target.secret())
        return document["decision"], document["quarantine"]

    def missing(database: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        raise click.ClickException(
            f"{subject}: gpuwatchd is not running and there is no {database}, so whether this "
            "node has it is unknown; start gpuwatchd once, or quarantine node"
        )

    def local(offline: Offline) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        text = check_text(reason, "reason", required=True)
        name = offline.subject(subject)
        decision = offline.quarantine(name, text, operator)
        held = next(q for q in offline.quarantines() if q.subject == name)
        return (
            dataclasses.asdict(decision) if decision is not None else None,
            dataclasses.asdict(held),
        )

    creates = subject.strip() == NODE
    decision, held = daemon_or_database(target, remote, local, None if creates else missing)
    if decision is None:
        click.echo(
            f"{held['subject']} was already quarantined ({held['source']}, since "
            f"{format_time(held['since'])}): {held['reason']}; left as it was"
        )
    else:
        click.echo(f"quarantined {decision['subject']}: {decision['reason']}")


@quarantine.command("release")
@click.argument("subject")
@click.option("--reason", default="", help="Why (default: released by <you>).")
@target_options
def quarantine_release(
    subject: str,
    reason: str,
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
) -> None:
    """Release SUBJECT, whoever quarantined it."""
    target = resolve_target(node_url, config_path, token_file, state_dir)
    operator = local_operator()

    def remote() -> dict[str, Any] | None:
        body = {"reason": reason, "operator": operator}
        try:
            document = target.client.send("DELETE", subject_path(subject), body, target.secret())
        except DaemonError as error:
            if error.status == 404:
                return None
            raise
        decision: dict[str, Any] = document["decision"]
        return decision

    def local(offline: Offline) -> dict[str, Any] | None:
        text = check_text(reason, "reason", required=False)
        decision = offline.release(offline.subject(subject), text, operator)
        return dataclasses.asdict(decision) if decision is not None else None

    def missing(database: str) -> dict[str, Any] | None:
        click.echo(f"gpuwatchd is not running here, and there is no {database}", err=True)
        return None

    decision = daemon_or_database(target, remote, local, missing)
    if decision is None:
        raise click.ClickException(f"{subject} is not quarantined")
    click.echo(f"released {decision['subject']}: {decision['reason']}")


@quarantine.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@target_options
def quarantine_list(
    as_json: bool,
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
) -> None:
    """The node's quarantines."""
    target = resolve_target(node_url, config_path, token_file, state_dir)

    def remote() -> list[dict[str, Any]]:
        quarantines: list[dict[str, Any]] = target.client.get("/api/v1/quarantines")["quarantines"]
        return quarantines

    def local(offline: Offline) -> list[dict[str, Any]]:
        return [dataclasses.asdict(q) for q in offline.quarantines()]

    def missing(database: str) -> list[dict[str, Any]]:
        click.echo(f"gpuwatchd is not running here, and there is no {database}", err=True)
        return []

    quarantines = daemon_or_database(target, remote, local, missing, writes=False)
    if as_json:
        click.echo(json.dumps(quarantines, indent=2, sort_keys=True))
    else:
        click.echo(render_quarantines(quarantines))
