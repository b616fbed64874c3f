"""The `gpuwatchd` command: run the daemon, show a node's status, check a
config, quarantine and release by hand, and Slurm's health check."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any, TypeVar

import click

from gpuwatchd import __version__, logs
from gpuwatchd.actions.client import (
    DaemonClient,
    DaemonDown,
    DaemonError,
    DaemonUnreachable,
    Offline,
    subject_path,
)
from gpuwatchd.actions.manual import check_text, local_operator
from gpuwatchd.assemble import build_daemon
from gpuwatchd.canary.cli import canary
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import (
    DEFAULT_CONFIG_PATH,
    SOURCE_NAMES,
    Config,
    load_config,
    parse_listen,
)
from gpuwatchd.daemon import Daemon
from gpuwatchd.notify import Notifier
from gpuwatchd.server import StatusServer, base_url, client_secret, ensure_token_file
from gpuwatchd.settings import SettingsError
from gpuwatchd.sim.scenario import ScenarioError
from gpuwatchd.sources import SourceUnavailable
from gpuwatchd.status import render_quarantines, render_table
from gpuwatchd.store import DB_NAME, JournalEntry, Store, StoreError
from gpuwatchd.units import parse_duration

log = logging.getLogger("gpuwatchd")

T = TypeVar("T")


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
        config = config.only_sources(sources) if sources else config
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    chosen = config.sources
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
        _prepare_token_file(config.token_file)
        # With api.listen the control API listens apart from /metrics.
        apart = config.api.listen is not None
        server = _listen(config, daemon, clock, config.daemon.listen, control=not apart)
        stack.callback(server.stop)
        if config.api.listen is not None:
            stack.callback(_listen(config, daemon, clock, config.api.listen, control=True).stop)

        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            daemon.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info(
            "gpuwatchd %s serving %s/metrics, sources: %s%s",
            __version__,
            server.url,
            ", ".join(config.enabled_sources()) or "none",
            f", simulating {simulate}" if simulate else "",
        )
        daemon.run(Notifier())
    log.info("stopped")


def _listen(
    config: Config, daemon: Daemon, clock: SystemClock, listen: str, control: bool
) -> StatusServer:
    """A started listener on `listen`: with the control API, or status only."""
    try:
        server = StatusServer(
            parse_listen(listen),
            daemon.registry,
            lambda: daemon.snapshot,
            max_poll_age_seconds=3 * config.daemon.poll_interval + 30,
            clock_now=clock.now,
            control=daemon if control else None,
            token_file=config.token_file,
            api=config.api,
        )
    except ssl.SSLError as error:
        raise click.ClickException(f"cannot use the TLS certificate or key: {error}") from error
    except OSError as error:
        raise click.ClickException(f"cannot listen on {listen}: {error.strerror}") from error
    server.start()
    return server


def _prepare_token_file(path: str) -> None:
    try:
        if ensure_token_file(path):
            log.info("created the API token file %s", path)
    except OSError as error:
        log.error(
            "cannot create the API token file %s: %s; API writes will be refused", path, error
        )


def _local_url(config: Config) -> str:
    host, port = parse_listen(config.api.listen or config.daemon.listen)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return base_url(host, port, tls=bool(config.api.tls_cert_file))


def _client(config: Config, node_url: str | None) -> DaemonClient:
    """The daemon at --node, else the local one. A local daemon's own
    certificate is trusted as its CA (a self-signed one naming 127.0.0.1)."""
    if node_url is not None:
        return DaemonClient(node_url)
    context = None
    if config.api.tls_cert_file:
        context = ssl.create_default_context(cafile=config.api.tls_cert_file)
    return DaemonClient(_local_url(config), context)


def _unreachable(client: DaemonClient, error: Exception) -> click.ClickException:
    return click.ClickException(
        f"cannot reach the gpuwatchd daemon at {client.url}: {error} "
        "(is it running? `gpuwatchd run`, or --node URL)"
    )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--node", "node_url", help="URL of the daemon (default: the local one).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
def status(as_json: bool, node_url: str | None, config_path: str | None) -> None:
    """What a node's daemon sees now."""
    client = _client(_load(config_path), node_url)
    try:
        document = client.get("/api/v1/status")
    except (DaemonUnreachable, DaemonError) as error:
        raise _unreachable(client, error) from error
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


main.add_command(canary)


@dataclass(frozen=True)
class _Target:
    """The daemon a command talks to, and what it falls back on."""

    config: Config
    client: DaemonClient
    explicit: bool  # --node given: never fall back on the local database
    token_file: str
    state_dir: str

    def secret(self) -> str | None:
        """The token to send; None when the file cannot be read (the daemon's
        401 then says so, and offline mode needs none)."""
        try:
            return client_secret(self.token_file)
        except (OSError, ValueError):
            return None


def _target_options(command: Callable[..., None]) -> Callable[..., None]:
    options = (
        click.option(
            "--node",
            "node_url",
            help="URL of the daemon (default: the local one, or its state database when it "
            "is not running).",
        ),
        click.option(
            "--config", "config_path", type=click.Path(dir_okay=False), help="Config file."
        ),
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False),
            help="API token file (default: the config's api.token_file).",
        ),
        click.option(
            "--state-dir",
            type=click.Path(file_okay=False),
            help="State directory used when the local daemon is not running.",
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command


def _target(
    node_url: str | None, config_path: str | None, token_file: str | None, state_dir: str | None
) -> _Target:
    config = _load(config_path)
    return _Target(
        config=config,
        client=_client(config, node_url),
        explicit=node_url is not None,
        token_file=token_file or config.token_file,
        state_dir=state_dir or config.daemon.state_dir,
    )


@contextmanager
def _offline(target: _Target) -> Iterator[Offline]:
    try:
        with Offline(target.config, target.state_dir) as offline:
            yield offline
    except StoreError as error:
        raise click.ClickException(str(error)) from error
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


def _daemon_or_database(
    target: _Target, remote: Callable[[], T], local: Callable[[Offline], T]
) -> T:
    """`remote()` against the daemon; `local(...)` on the state database when
    the local daemon is not running (never for an explicit --node)."""
    try:
        return remote()
    except DaemonDown as error:
        if target.explicit:
            raise _unreachable(target.client, error) from error
    except DaemonUnreachable as error:
        raise _unreachable(target.client, error) from error
    except DaemonError as error:
        hint = f" (token from {target.token_file})" if error.status == 401 else ""
        raise click.ClickException(f"{error}{hint}") from error
    click.echo(
        f"gpuwatchd is not running here: using the state database in {target.state_dir}; "
        "the daemon applies the change when it starts",
        err=True,
    )
    with _offline(target) as offline:
        return local(offline)


@main.group()
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
@_target_options
def quarantine_add(
    subject: str,
    reason: str,
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
) -> None:
    """Quarantine SUBJECT."""
    target = _target(node_url, config_path, token_file, state_dir)
    operator = local_operator()

    def remote() -> dict[str, Any]:
        body = {"subject": subject, "reason": reason, "operator": operator}
        document = target.client.send("POST", "/api/v1/quarantines", body, target.secret())
        decision: dict[str, Any] = document["decision"]
        return decision

    def local(offline: Offline) -> dict[str, Any]:
        text = check_text(reason, "reason", required=True)
        return dataclasses.asdict(offline.quarantine(offline.subject(subject), text, operator))

    decision = _daemon_or_database(target, remote, local)
    click.echo(f"quarantined {decision['subject']}: {decision['reason']}")


@quarantine.command("release")
@click.argument("subject")
@click.option("--reason", default="", help="Why (default: released by <you>).")
@_target_options
def quarantine_release(
    subject: str,
    reason: str,
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
) -> None:
    """Release SUBJECT, whoever quarantined it."""
    target = _target(node_url, config_path, token_file, state_dir)
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

    decision = _daemon_or_database(target, remote, local)
    if decision is None:
        raise click.ClickException(f"{subject} is not quarantined")
    click.echo(f"released {decision['subject']}: {decision['reason']}")


@quarantine.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@_target_options
def quarantine_list(
    as_json: bool,
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
) -> None:
    """The node's quarantines."""
    target = _target(node_url, config_path, token_file, state_dir)

    def remote() -> list[dict[str, Any]]:
        quarantines: list[dict[str, Any]] = target.client.get("/api/v1/quarantines")["quarantines"]
        return quarantines

    def local(offline: Offline) -> list[dict[str, Any]]:
        return [dataclasses.asdict(q) for q in offline.quarantines()]

    quarantines = _daemon_or_database(target, remote, local)
    if as_json:
        click.echo(json.dumps(quarantines, indent=2, sort_keys=True))
    else:
        click.echo(render_quarantines(quarantines))


# Node health that takes the node out of Slurm.
UNFIT = ("unhealthy", "quarantined")


@main.command("slurm-healthcheck")
@click.option("--node", "node_url", help="URL of the daemon (default: the local one).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--state-dir", type=click.Path(file_okay=False), help="State directory.")
def slurm_healthcheck(node_url: str | None, config_path: str | None, state_dir: str | None) -> None:
    """Exit 1 with a one-line reason when the node is unhealthy or quarantined.

    For a Slurm Prolog (a failing prolog drains the node and requeues the job)
    or NHC's check_cmd_status. Asks the local daemon, or reads its state
    database when it is not running. A daemon that does not answer is no
    verdict on the node: that exits 0 with a warning.
    """
    target = _target(node_url, config_path, None, state_dir)

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
    except DaemonDown:
        if target.explicit or not os.path.exists(database):
            click.echo(f"gpuwatchd: no verdict (not running, no state database at {database})")
            return
        with _offline(target) as offline:
            health, quarantines = offline.node_verdict()
        why = _why([dataclasses.asdict(q) for q in quarantines], [])
    except (DaemonUnreachable, DaemonError) as error:
        click.echo(f"gpuwatchd: no verdict ({error})")
        return
    if health in UNFIT:
        click.echo(f"gpuwatchd: node {health}: {why}")
        sys.exit(1)
    click.echo(f"gpuwatchd: node {health}")


def _why(quarantines: list[dict[str, Any]], findings: list[str]) -> str:
    live = [f"{q['subject']} {q['reason']}" for q in quarantines if not q["dry_run"]]
    return "; ".join(live or findings) or "see `gpuwatchd status`"
