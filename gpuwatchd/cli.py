"""The `gpuwatchd` command: run the daemon, show a node's status, check a config."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import replace
from types import FrameType
from typing import Any

import click

from gpuwatchd import __version__, logs
from gpuwatchd.assemble import build_daemon
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import (
    DEFAULT_CONFIG_PATH,
    SOURCE_NAMES,
    Config,
    load_config,
    parse_listen,
)
from gpuwatchd.notify import Notifier
from gpuwatchd.server import StatusServer
from gpuwatchd.settings import SettingsError
from gpuwatchd.sim.scenario import ScenarioError
from gpuwatchd.sources import SourceUnavailable
from gpuwatchd.status import render_table
from gpuwatchd.store import DB_NAME, JournalEntry, Store, StoreError
from gpuwatchd.units import parse_duration

log = logging.getLogger("gpuwatchd")


def _config_path(path: str | None) -> str | None:
    """An explicit --config, else the system file when it exists, else defaults."""
    if path is not None:
        return path
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None


def _load(path: str | None) -> Config:
    try:
        return load_config(_config_path(path))
    except SettingsError as error:
        raise click.ClickException(str(error)) from error


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


def _apply_overrides(
    config: Config,
    listen: str | None,
    state_dir: str | None,
    interval: float | None,
    sources: tuple[str, ...],
    sysfs_root: str | None,
) -> Config:
    daemon = config.daemon
    try:
        if listen is not None:
            parse_listen(listen)
            daemon = replace(daemon, listen=listen)
        if state_dir is not None:
            daemon = replace(daemon, state_dir=state_dir)
        if interval is not None:
            daemon = replace(daemon, poll_interval=interval)
        chosen = config.sources.only(sources) if sources else config.sources
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    if sysfs_root is not None:
        chosen = replace(chosen, infiniband=replace(chosen.infiniband, sysfs_root=sysfs_root))
    return replace(config, daemon=daemon, sources=chosen)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuwatchd")
def main() -> None:
    """GPU cluster health agent: reads NVML and InfiniBand, judges health,
    exports it to Prometheus and acts on quarantine decisions."""


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option(
    "--simulate",
    is_flag=False,
    flag_value="default",
    default=None,
    metavar="[SCENARIO]",
    help="Run against a simulated node; SCENARIO is a file or a built-in name (default).",
)
@click.option("--listen", help="HOST:PORT for /metrics and the API (overrides the config).")
@click.option("--state-dir", type=click.Path(file_okay=False), help="State directory.")
@click.option("--interval", callback=_duration, help="Poll interval such as 10s.")
@click.option(
    "--source",
    "sources",
    multiple=True,
    type=click.Choice(SOURCE_NAMES),
    help="Run only this source (repeatable).",
)
@click.option(
    "--sysfs-root", type=click.Path(file_okay=False), help="Read InfiniBand under this root."
)
def run(
    config_path: str | None,
    simulate: str | None,
    listen: str | None,
    state_dir: str | None,
    interval: float | None,
    sources: tuple[str, ...],
    sysfs_root: str | None,
) -> None:
    """Run the daemon in the foreground."""
    config = _load(config_path)
    config = _apply_overrides(config, listen, state_dir, interval, sources, sysfs_root)
    logs.setup(config.daemon.log_level, journal="JOURNAL_STREAM" in os.environ)
    with ExitStack() as stack:
        if simulate is not None and state_dir is None:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-sim-"))
            config = replace(config, daemon=replace(config.daemon, state_dir=scratch))
        clock = SystemClock()
        try:
            daemon = build_daemon(config, clock, simulate, stack)
        except (SourceUnavailable, ScenarioError) as error:
            raise click.ClickException(str(error)) from error
        host, port = parse_listen(config.daemon.listen)
        try:
            server = StatusServer(
                (host, port),
                daemon.registry,
                lambda: daemon.snapshot,
                max_poll_age_seconds=3 * config.daemon.poll_interval + 30,
                clock_now=clock.now,
            )
        except OSError as error:
            raise click.ClickException(
                f"cannot listen on {config.daemon.listen}: {error.strerror}"
            ) from error
        server.start()
        stack.callback(server.stop)

        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            daemon.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info(
            "gpuwatchd %s serving %s/metrics, sources: %s%s",
            __version__,
            server.url,
            ", ".join(config.sources.enabled()) or "none",
            f", simulating {simulate}" if simulate else "",
        )
        daemon.run(Notifier())
    log.info("stopped")


def _fetch_status(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/status", timeout=10) as response:
            document: dict[str, Any] = json.load(response)
            return document
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise click.ClickException(
            f"cannot reach the gpuwatchd daemon at {url}: {reason} "
            "(is it running? `gpuwatchd run`, or --node URL)"
        ) from error


def _local_url(config: Config) -> str:
    host, port = parse_listen(config.daemon.listen)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--node", "node_url", help="URL of the daemon (default: the local one).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
def status(as_json: bool, node_url: str | None, config_path: str | None) -> None:
    """What a node's daemon sees now."""
    url = node_url or _local_url(_load(config_path))
    document = _fetch_status(url)
    if as_json:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    else:
        click.echo(render_table(document))


@main.command("check-config")
@click.argument("path", type=click.Path(dir_okay=False))
def check_config(path: str) -> None:
    """Validate a config file: exit 0, or name the file, line and key that is wrong."""
    try:
        load_config(path)
    except SettingsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    click.echo(f"{path}: ok")


def _format_entry(entry: JournalEntry) -> str:
    when = datetime.datetime.fromtimestamp(entry.time, tz=datetime.UTC)
    parts = [when.strftime("%Y-%m-%d %H:%M:%SZ"), entry.kind, entry.subject]
    if entry.code:
        parts.append(f"{entry.check}/{entry.code}" if entry.check else entry.code)
    if entry.severity:
        parts.append(entry.severity)
    if entry.source:
        parts.append(f"({entry.source}{', ' + entry.operator if entry.operator else ''})")
    if entry.dry_run:
        parts.append("[dry run]")
    return " ".join(parts) + f": {entry.message}"


@main.command()
@click.option(
    "--since",
    callback=_duration,
    default="24h",
    show_default=True,
    help="How far back, such as 30m or 7d.",
)
@click.option("--subject", help="Only this subject (node, gpu:N, nvlink:N/L, ib:DEV/PORT).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines for scripts.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--state-dir", type=click.Path(file_okay=False), help="State directory.")
def journal(
    since: float,
    subject: str | None,
    as_json: bool,
    config_path: str | None,
    state_dir: str | None,
) -> None:
    """Findings, health changes and decisions, oldest first, from the state database."""
    directory = state_dir or _load(config_path).daemon.state_dir
    path = os.path.join(directory, DB_NAME)
    if not os.path.exists(path):
        raise click.ClickException(f"no state database at {path} (has gpuwatchd run here?)")
    try:
        store = Store.open(directory)
    except StoreError as error:
        raise click.ClickException(str(error)) from error
    try:
        entries = store.journal(since=time.time() - since, subject=subject)
    finally:
        store.close()
    for entry in entries:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(entry), sort_keys=True, default=dict))
        else:
            click.echo(_format_entry(entry))
