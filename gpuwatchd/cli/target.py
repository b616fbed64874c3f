"""The daemon a command talks to and the state database it falls back on:
the client for --node or the local daemon, the API token a write sends,
and `daemon_or_database`, which asks the daemon and, when the local one is
not running, reads or writes its state database instead."""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

import click

from gpuwatchd.actions.client import (
    REQUEST_TIMEOUT_SECONDS,
    DaemonClient,
    DaemonDown,
    DaemonError,
    DaemonUnreachable,
    Offline,
)
from gpuwatchd.cli.common import config_option, node_option, read_config, state_dir_option
from gpuwatchd.config import STATE_DIR_ENV, Config, parse_listen, unix_socket_path
from gpuwatchd.server import base_url, client_secret
from gpuwatchd.store import DB_NAME, LOCK_WAIT_SECONDS, StoreError

T = TypeVar("T")


def _local_url(config: Config) -> str:
    listen = config.api.listen or config.daemon.listen
    if unix_socket_path(listen) is not None:
        return listen
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return base_url(host, port, tls=bool(config.api.tls_cert_file))


def daemon_client(
    config: Config, node_url: str | None, timeout: float = REQUEST_TIMEOUT_SECONDS
) -> DaemonClient:
    """The daemon at --node, else the local one. A local daemon's own
    certificate is trusted as its CA (a self-signed one naming 127.0.0.1)."""
    if node_url is not None:
        if "://" not in node_url and unix_socket_path(node_url) is None:
            raise click.BadParameter(
                f"{node_url!r} is not a URL: write http://{node_url} (or https://, "
                "or unix:/path/to/api.sock)",
                param_hint="--node",
            )
        return DaemonClient(node_url, timeout=timeout)
    context = None
    if config.api.tls_cert_file:
        context = ssl.create_default_context(cafile=config.api.tls_cert_file)
    return DaemonClient(_local_url(config), context, timeout)


def unreachable(client: DaemonClient, error: Exception) -> click.ClickException:
    return click.ClickException(
        f"cannot reach the gpuwatchd daemon at {client.url}: {error} "
        "(is it running? `gpuwatchd run`, or --node URL)"
    )


class Neither(click.ClickException):
    """Neither the daemon nor its state database answers: a running daemon
    holds the database (gpuwatchd.store) but not at the address the CLI asks."""

    exit_code = 2


def database_held(database: str, client: DaemonClient, why: object = None) -> Neither:
    return Neither(
        f"the state database {database} is held by a running gpuwatchd, which does not "
        f"answer at {client.url}{f' ({why})' if why else ''}: is it starting, or listening "
        "elsewhere? (--node URL, or --config with its api.listen or daemon.listen)"
    )


def token_file_exposed(path: str) -> str | None:
    """What is wrong with a token file others can read or write, if anything:
    whoever reads it can quarantine and release, whoever writes it add tokens."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None  # missing or unreadable: said where it is used
    if mode & 0o077 == 0:
        return None
    return f"the API token file {path} is open to other users (mode {mode:04o})"


def other_state_dir(client: DaemonClient, directory: str) -> str | None:
    """The state directory the daemon at `client` holds when it is not
    `directory` (review adversarial-2, row 289: the journal of another
    daemon was printed as this directory's); None when it is, or when the
    daemon does not say (one older than this CLI)."""
    held = client.get("/api/v1/status").get("state_dir")
    if not isinstance(held, str):
        return None
    try:
        return None if os.path.samefile(held, directory) else held
    except OSError:
        return held  # not there as this CLI sees the files: not the same


@dataclass(frozen=True)
class Target:
    """The daemon a command talks to, and what it falls back on."""

    config: Config
    client: DaemonClient
    explicit: bool  # --node given: never fall back on the local database
    token_file: str
    state_dir: str

    def secret(self) -> str:
        """The token a write sends. Without one the daemon would refuse the
        write (and journal the refusal), so nothing is sent and the reason is
        the message, once a read says the daemon is there (a daemon down is
        the message first; the state database needs no token)."""
        exposed = token_file_exposed(self.token_file)
        if exposed:
            click.echo(f"warning: {exposed}; chmod 600 {self.token_file}", err=True)
        try:
            return client_secret(self.token_file)
        except (OSError, ValueError) as error:
            self.client.get("/api/v1/status")
            raise click.ClickException(
                f"nothing was sent to {self.client.url}, which takes changes only with a "
                f"token: {self.token_problem()}"
            ) from error

    def token_problem(self) -> str:
        """Why a 401 came back, as far as the token file tells."""
        try:
            client_secret(self.token_file)
        except OSError as error:
            return (
                f"cannot read the API token file {self.token_file}: {error.strerror} "
                f"(--token-file, or ${STATE_DIR_ENV} as a simulated daemon prints it)"
            )
        except ValueError as error:
            return f"the API token file {self.token_file}: {error}"
        return f"the daemon refused the token from {self.token_file}"


def target_options(command: Callable[..., None]) -> Callable[..., None]:
    """--node, --config, --token-file and --state-dir: what `resolve_target` takes."""
    options = (
        node_option(
            "URL of the daemon (default: the local one, or its state database when it "
            "is not running).",
        ),
        config_option(),
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False),
            help="API token file (default: the config's api.token_file, or api-token in the "
            "state directory).",
        ),
        state_dir_option("State directory used when the local daemon is not running."),
    )
    for option in reversed(options):
        command = option(command)
    return command


def resolve_target(
    node_url: str | None,
    config_path: str | None,
    token_file: str | None,
    state_dir: str | None,
    timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> Target:
    config = read_config(config_path)
    if state_dir is not None:
        # The token file in that state directory, unless the config names one.
        config = replace(config, daemon=replace(config.daemon, state_dir=state_dir))
    return Target(
        config=config,
        client=daemon_client(config, node_url, timeout),
        explicit=node_url is not None,
        token_file=token_file or config.token_file,
        state_dir=config.daemon.state_dir,
    )


@contextmanager
def offline_database(
    target: Target, wait: float = LOCK_WAIT_SECONDS, why: str | None = None
) -> Iterator[Offline]:
    """The state database, for a daemon that did not answer (`why` it is not
    the database's); `Neither` when it is held, by a daemon running where the
    CLI did not ask."""
    try:
        with Offline(target.config, target.state_dir, wait) as offline:
            yield offline
    except StoreError as error:
        if error.held:
            raise database_held(error.path, target.client, why) from error
        raise click.ClickException(str(error)) from error
    except ValueError as error:
        # Exit 1 like the daemon's refusal of the same subject.
        raise click.ClickException(str(error)) from error


def daemon_or_database(
    target: Target,
    remote: Callable[[], T],
    local: Callable[[Offline], T],
    missing: Callable[[str], T] | None = None,
    writes: bool = True,
) -> T:
    """`remote()` against the daemon; `local(...)` on the state database when
    the local daemon is not running (never for an explicit --node). When there
    is no database, `missing(path)` answers (or refuses) instead of creating
    one, since an empty database would later read as a healthy node; with no
    `missing` the database is created. A daemon that holds another state
    directory than the target's is not asked either."""
    elsewhere = None
    try:
        if not target.explicit:
            elsewhere = other_state_dir(target.client, target.state_dir)
        if elsewhere is None:
            return remote()
    except DaemonDown as error:
        if target.explicit:
            raise unreachable(target.client, error) from error
    except DaemonUnreachable as error:
        raise unreachable(target.client, error) from error
    except DaemonError as error:
        hint = f" ({target.token_problem()})" if error.status == 401 else ""
        raise click.ClickException(f"{error}{hint}") from error
    database = os.path.join(target.state_dir, DB_NAME)
    if missing is not None and not os.path.exists(database):
        return missing(database)
    there = None if elsewhere is None else f"the daemon there holds {elsewhere}"
    with offline_database(target, why=there) as offline:
        # Said once the database is open: a daemon elsewhere may hold it.
        absent = "gpuwatchd is not running here"
        if elsewhere is not None:
            absent = f"the gpuwatchd at {target.client.url} holds {elsewhere}, not this directory"
        if writes:
            click.echo(
                f"{absent}: using the state database {database}; "
                "the daemon applies the change when it starts",
                err=True,
            )
        else:
            click.echo(f"{absent}: reading the state database {database}", err=True)
        return local(offline)
