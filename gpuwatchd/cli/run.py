"""`gpuwatchd run`: the daemon in the foreground, with its listeners (the
metrics address and, apart or not, the control API), the API token file,
signals, and the line that points the CLI in another terminal at a
simulated daemon."""

from __future__ import annotations

import faulthandler
import logging
import os
import shlex
import signal
import socket
import ssl
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import replace
from types import FrameType

import click

from gpuwatchd import heap, logs, unix_socket, version
from gpuwatchd.assemble import build_daemon
from gpuwatchd.cli.common import (
    NODE_ENV,
    apply_overrides,
    config_option,
    duration_value,
    read_config,
)
from gpuwatchd.cli.target import token_file_exposed
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import (
    DEFAULT_LISTEN,
    DEFAULT_STATE_DIR,
    LOG_LEVELS,
    SOURCE_NAMES,
    STATE_DIR_ENV,
    Config,
    parse_listen,
    unix_socket_path,
)
from gpuwatchd.daemon import Daemon
from gpuwatchd.notify import Notifier
from gpuwatchd.server import StatusServer, UnixStatusServer, ensure_token_file
from gpuwatchd.sim.scenario import ScenarioError
from gpuwatchd.sources import SourceUnavailable
from gpuwatchd.store import StoreError
from gpuwatchd.terminal import colour_wanted

log = logging.getLogger("gpuwatchd")


@click.command()
@config_option()
@click.option(
    "--simulate",
    is_flag=False,
    flag_value="default",
    default=None,
    metavar="[SCENARIO]",
    help="Run against a simulated node; SCENARIO is a file or a built-in name (default).",
)
@click.option(
    "--listen",
    help=f"HOST:PORT for /metrics and the API (default: the config's, {DEFAULT_LISTEN}).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help=f"State directory (default: the config's, {DEFAULT_STATE_DIR}; with --simulate, "
    "a temporary one unless the config names another).",
)
@click.option("--interval", callback=duration_value, help="Poll interval such as 10s.")
@click.option(
    "--source",
    "sources",
    multiple=True,
    type=click.Choice(SOURCE_NAMES),
    help="Run only this source (repeatable).",
)
@click.option(
    "--sysfs-root",
    type=click.Path(file_okay=False),
    help="Read InfiniBand and PCIe under this root.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    help="Log from this level on (default: the config's daemon.log_level, info).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level (--log-level debug).")
def run(
    config_path: str | None,
    simulate: str | None,
    listen: str | None,
    state_dir: str | None,
    interval: float | None,
    sources: tuple[str, ...],
    sysfs_root: str | None,
    log_level: str | None,
    verbose: bool,
) -> None:
    """Run the daemon in the foreground.

    Built-in scenarios for --simulate: default (a calm node with a few faults
    in the first minutes) and calm.
    """
    config = read_config(config_path)
    config = apply_overrides(config, listen, state_dir, interval, sources, sysfs_root)
    level = "debug" if verbose else log_level or config.daemon.log_level
    logs.setup(level, journal="JOURNAL_STREAM" in os.environ)
    # A fatal signal inside C code (SIGBUS in a library's mapping of a file
    # on a full or damaged filesystem, say; the state database maps none)
    # cannot be survived, but is said with the Python stack where the daemon
    # logs, not silently (unless a host such as pytest has its own handler).
    if not faulthandler.is_enabled():
        faulthandler.enable()
    heap.return_freed_heap()
    for address in (config.daemon.listen, config.api.listen):
        if address is not None:
            _check_listen_free(address)
    with ExitStack() as stack:
        scratch = None
        # A simulated node never writes into the real node's state directory:
        # it gets a temporary one unless one was named (flag or config).
        if simulate is not None and config.daemon.state_dir == DEFAULT_STATE_DIR:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-sim-"))
            config = replace(config, daemon=replace(config.daemon, state_dir=scratch))
        clock = SystemClock()
        try:
            daemon = build_daemon(config, clock, simulate, stack)
        except (SourceUnavailable, ScenarioError) as error:
            raise click.ClickException(str(error)) from error
        except StoreError as error:  # another process holds it, or it is newer
            if error.newer:
                raise click.ClickException(
                    f"{error}; this daemon does not start without it, as it would know none "
                    "of its quarantines (CHANGELOG.md, Upgrade and rollback)"
                ) from error
            raise click.ClickException(
                f"the state database {error.path} is held by another process: another "
                f"gpuwatchd runs with the state directory {config.daemon.state_dir} "
                "(one daemon a state directory; stop it, or give this one --state-dir)"
            ) from error
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
            version.describe(),
            server.url,
            ", ".join(config.enabled_sources()) or "none",
            f", simulating {simulate}" if simulate else "",
        )
        daemon.run(Notifier() if scratch is None else _TellWhere(scratch, server.url, config))
    log.info("stopped")


def _check_listen_free(listen: str) -> None:
    """Refuse a taken address before NVML starts and files are written; the
    server's own bind, later, still decides (something may take it between)."""
    socket_path = unix_socket_path(listen)
    try:
        if socket_path is not None:
            unix_socket.stale_socket(socket_path)
        else:
            _check_port_free(*parse_listen(listen))
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {listen}: {error.strerror or error}"
        ) from error


def _check_port_free(host: str, port: int) -> None:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server binds: a port in TIME_WAIT is free to it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


# Printed above the export line: short enough not to wrap in 120 columns.
TELL_WHERE = (
    "# for gpuwatchd commands in another terminal (this node's state goes when it stops; "
    "--state-dir keeps it):"
)


class _TellWhere(Notifier):
    """systemd's notifier that, once the first poll is done (READY), also
    prints the line pointing the CLI in another terminal at a simulated
    daemon whose state lives in a temporary directory: after the start's
    burst of log lines, where it is the last one, in bold on a terminal."""

    def __init__(self, state_dir: str, url: str, config: Config) -> None:
        super().__init__()
        variables = [f"{STATE_DIR_ENV}={shlex.quote(state_dir)}"]
        if config.daemon.listen != DEFAULT_LISTEN:
            variables.append(f"{NODE_ENV}={shlex.quote(url)}")
        self.line = f"export {' '.join(variables)}"

    def ready(self, status: str) -> None:
        super().ready(status)
        bold = colour_wanted(sys.stderr, os.environ)
        click.echo(TELL_WHERE, err=True)
        click.echo(click.style(self.line, bold=True) if bold else self.line, err=True)


def _listen(
    config: Config, daemon: Daemon, clock: SystemClock, listen: str, control: bool
) -> StatusServer:
    """A started listener on `listen`: with the control API, or status only."""
    socket_path = unix_socket_path(listen)
    kind = StatusServer if socket_path is None else UnixStatusServer
    try:
        server = kind(
            parse_listen(listen) if socket_path is None else socket_path,
            daemon.metrics,
            lambda: daemon.snapshot,
            max_poll_age_seconds=3 * config.daemon.poll_interval + 30,
            clock_now=clock.now,
            control=daemon if control else None,
            token_file=config.token_file,
            api=config.api,
            state_dir=os.path.abspath(config.daemon.state_dir),
        )
    except ssl.SSLError as error:
        raise click.ClickException(f"cannot use the TLS certificate or key: {error}") from error
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {listen}: {error.strerror or error}"
        ) from error
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
    exposed = token_file_exposed(path)
    if exposed:
        log.warning("%s; chmod 600 %s", exposed, path)
