"""`gpuwatchd status` and `gpuwatchd journal`: what a node's daemon sees
now, and its findings, health changes and decisions over a window, from the
daemon's API or from its state database."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import time
import urllib.parse
from dataclasses import dataclass

import click

from gpuwatchd.actions.client import DaemonClient, DaemonDown, DaemonError, DaemonUnreachable
from gpuwatchd.cli.common import config_option, node_option, read_config, state_dir_option
from gpuwatchd.cli.target import daemon_client, database_held, other_state_dir, unreachable
from gpuwatchd.config import STATE_DIR_ENV, Config
from gpuwatchd.server import MAX_JOURNAL_ENTRIES
from gpuwatchd.status import render_table
from gpuwatchd.store import DB_NAME, LOCK_WAIT_SECONDS, JournalEntry, Store, StoreError
from gpuwatchd.terminal import colour_wanted, styled
from gpuwatchd.units import parse_moment


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@node_option("URL of the daemon (default: the local one).")
@config_option()
def status(as_json: bool, node_url: str | None, config_path: str | None) -> None:
    """What a node's daemon sees now."""
    client = daemon_client(read_config(config_path), node_url)
    try:
        document = client.get("/api/v1/status")
    except (DaemonUnreachable, DaemonError) as error:
        raise unreachable(client, error) from error
    if as_json:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    elif colour_wanted(sys.stdout, os.environ):
        click.echo(render_table(document, styled), color=True)
    else:
        click.echo(render_table(document))


def _format_entry(entry: JournalEntry) -> str:
    when = datetime.datetime.fromtimestamp(entry.time, tz=datetime.UTC)
    parts = [when.strftime("%Y-%m-%d %H:%M:%SZ"), entry.kind, entry.subject]
    if entry.fault_code:
        parts.append(entry.fault_code)
    if entry.code:
        parts.append(f"{entry.check}/{entry.code}" if entry.check else entry.code)
    if entry.severity:
        parts.append(entry.severity)
    if entry.source:
        parts.append(f"({entry.source}{', ' + entry.operator if entry.operator else ''})")
    if entry.dry_run:
        parts.append("[dry run]")
    return " ".join(parts) + f": {entry.message}"


def _moment(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_moment(value, time.time())
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


@click.command()
@click.option(
    "--since",
    callback=_moment,
    default="24h",
    show_default=True,
    help="From: a duration back such as 30m or 7d, or seconds since the epoch.",
)
@click.option(
    "--until",
    callback=_moment,
    help="Up to (not including): a duration back or seconds since the epoch (default: now).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_JOURNAL_ENTRIES),
    default=1000,
    show_default=True,
    help="At most this many entries: the newest of the window (printed oldest first); "
    "a notice on stderr says when older ones were left out.",
)
@click.option("--subject", help="Only this subject (node, gpu:N, nvlink:N/L, ib:DEV/PORT).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines for scripts.")
@node_option(
    "Ask the daemon at this URL (default: read the local state database, or ask the "
    "local daemon, which holds it while it runs)."
)
@config_option()
@state_dir_option("State directory (default: the config's daemon.state_dir).")
def journal(
    since: float,
    until: float | None,
    limit: int,
    subject: str | None,
    as_json: bool,
    node_url: str | None,
    config_path: str | None,
    state_dir: str | None,
) -> None:
    """Findings, health changes and decisions, oldest first, from the state
    database, through the local daemon while it runs (or from the daemon at
    --node)."""
    config = read_config(config_path)
    window = _Window(since, until, limit, subject)
    if node_url is not None:
        client = daemon_client(config, node_url)
        try:
            entries, truncated = _api_journal(client, window)
        except (DaemonUnreachable, DaemonError) as error:
            raise unreachable(client, error) from error
    elif state_dir is None:
        entries, truncated = _default_journal(config, window)
    else:
        entries, truncated = _local_journal(config, state_dir, window)
    for entry in entries:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(entry), sort_keys=True, default=dict))
        else:
            click.echo(_format_entry(entry))
    if truncated:
        # On stderr, so that --json output stays one entry a line.
        click.echo(
            f"note: older entries of the window were left out (only the newest {limit} "
            "are shown): raise --limit, or narrow --since, --until or --subject",
            err=True,
        )


@dataclass(frozen=True)
class _Window:
    """The journal entries asked for: the newest `limit` of the window."""

    since: float
    until: float | None
    limit: int
    subject: str | None


_Journal = tuple[tuple[JournalEntry, ...], bool]


def _no_database(path: str) -> str:
    return (
        f"no state database at {path} (has gpuwatchd run here? --state-dir, or "
        f"${STATE_DIR_ENV} as a simulated daemon prints it)"
    )


def _default_journal(config: Config, window: _Window) -> _Journal:
    """No state directory named: the config's, or, when it has no database,
    the journal of the daemon at the config's address, as `status` shows
    that daemon (a simulated one keeps its database elsewhere)."""
    path = os.path.join(config.daemon.state_dir, DB_NAME)
    if os.path.exists(path):
        return _local_journal(config, config.daemon.state_dir, window)
    client = daemon_client(config, None)
    try:
        held = client.get("/api/v1/status").get("state_dir")
        journal = _api_journal(client, window)
    except (DaemonUnreachable, DaemonError) as error:
        raise click.ClickException(
            f"{_no_database(path)}, and no daemon answers at {client.url} ({error})"
        ) from error
    where = f" (its state directory {held})" if isinstance(held, str) else ""
    click.echo(
        f"no state database at {path}: the journal of the gpuwatchd at {client.url}{where}",
        err=True,
    )
    return journal


def _local_journal(config: Config, directory: str, window: _Window) -> _Journal:
    """The newest entries of the window in the state database of `directory`,
    and whether older ones were left out. A running daemon holds its
    database: then the daemon at the config's address answers instead."""
    path = os.path.join(directory, DB_NAME)
    if not os.path.exists(path):
        raise click.ClickException(_no_database(path))
    try:
        # Without waiting: a daemon would hold it until it stops.
        return _database_journal(directory, 0.0, window)
    except StoreError as error:
        if not error.held:
            raise click.ClickException(str(error)) from error
    client = daemon_client(config, None)
    try:
        other = other_state_dir(client, directory)
        if other is not None:
            raise database_held(path, client, f"the daemon there holds {other}")
        return _api_journal(client, window)
    except DaemonDown:
        pass  # nothing listens there: the lock may be another command's, for a moment
    except (DaemonUnreachable, DaemonError) as error:
        raise database_held(path, client, error) from error
    try:
        return _database_journal(directory, LOCK_WAIT_SECONDS, window)
    except StoreError as error:
        if error.held:
            raise database_held(path, client) from error
        raise click.ClickException(str(error)) from error


def _database_journal(directory: str, wait: float, window: _Window) -> _Journal:
    store = Store.open(directory, wait=wait)
    try:
        # One more than asked says whether older entries were left out.
        entries = store.journal.entries(
            since=window.since, subject=window.subject, limit=window.limit + 1, until=window.until
        )
    finally:
        store.close()
    return entries[-window.limit :], len(entries) > window.limit


def _api_journal(client: DaemonClient, window: _Window) -> _Journal:
    """The API's journal, and whether older entries were left out."""
    # In full (repr): the same window as the database's own query.
    query = {"since": repr(window.since), "limit": str(window.limit)}
    if window.until is not None:
        query["until"] = repr(window.until)
    if window.subject is not None:
        query["subject"] = window.subject
    document = client.get(f"/api/v1/journal?{urllib.parse.urlencode(query)}")
    entries = tuple(JournalEntry(**entry) for entry in document["entries"])
    # A daemon older than `until` in the API ignores it: the entries from
    # `until` on are left out here (its truncation flag may then be wrong).
    kept = tuple(e for e in entries if window.until is None or e.time < window.until)
    return kept, bool(document.get("truncated"))
