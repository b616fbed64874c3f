"""The daemon's configuration: one frozen tree, loaded from YAML.

The documented default is `config/gpuwatchd.yaml`; every key there is a
field here, and a test keeps the two in step. Thresholds of a check live in
that check's module, beside the reason for their default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Annotated

from gpuwatchd.actions.fleet import FleetSafetyConfig
from gpuwatchd.actions.kubernetes import KubernetesConfig
from gpuwatchd.actions.slurm import SlurmConfig
from gpuwatchd.actions.webhook import WebhookConfig
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.checks.registry import ChecksConfig
from gpuwatchd.export.detail import ExportConfig
from gpuwatchd.policy import PolicyConfig
from gpuwatchd.settings import Check, Seconds, load, load_file
from gpuwatchd.sources import InfinibandSourceConfig, NvmlSourceConfig, PcieSourceConfig
from gpuwatchd.units import format_duration

DEFAULT_CONFIG_PATH = "/etc/gpuwatchd/gpuwatchd.yaml"
DEFAULT_LISTEN = "127.0.0.1:9477"
DEFAULT_STATE_DIR = "/var/lib/gpuwatchd"
API_TOKEN_NAME = "api-token"
# The state directory of the CLI's commands when --state-dir is not given
# (a simulated daemon prints it for the CLI in another terminal).
STATE_DIR_ENV = "GPUWATCHD_STATE_DIR"
# `api.listen: unix:/run/gpuwatchd/api.sock`: the control API on a Unix socket.
UNIX_PREFIX = "unix:"
# A listener's connections at most: beyond, its threads alone would take
# gigabytes (8 MiB of stack reserved each).
MAX_CONNECTIONS = 16384
# The longest path a Unix socket's address holds (sun_path, unix(7)).
MAX_UNIX_PATH_BYTES = 107
SOURCE_NAMES = ("nvml", "infiniband", "pcie", "canary")
LOG_LEVELS = ("debug", "info", "warning", "error")
# A shorter interval is a busy loop, not monitoring.
MIN_POLL_INTERVAL = 0.1
# The journal is pruned once an hour; a shorter retention (0 deletes at the
# next prune the findings that explain a quarantine, before anyone reads them)
# keeps less than an operator needs to see why a GPU was taken away.
MIN_JOURNAL_RETENTION = 3600.0
# A write's body is a few hundred bytes of JSON (a reason, an operator); each
# of the listener's 256 connections may hold one, so 1 MiB bounds them at 256 MiB.
MAX_BODY_BYTES = 1 << 20


def _retention(seconds: float) -> None:
    if seconds < MIN_JOURNAL_RETENTION:
        raise ValueError(
            f"journal_retention must be at least {format_duration(MIN_JOURNAL_RETENTION)} "
            "(the journal explains the daemon's decisions; it is pruned hourly)"
        )


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[v6]:PORT`) into its parts."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen must be HOST:PORT such as {DEFAULT_LISTEN}, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def unix_socket_path(listen: str) -> str | None:
    """The socket's path of `unix:<path>`; None for HOST:PORT."""
    return listen[len(UNIX_PREFIX) :] if listen.startswith(UNIX_PREFIX) else None


@dataclass(frozen=True)
class DaemonConfig:
    # How often every source is read. 10 s matches dcgm-exporter's default
    # collection interval and Prometheus' common scrape interval.
    poll_interval: Seconds = 10.0
    # Where /metrics, /healthz and /api/v1 are served. Loopback by default: the
    # control API must not be reachable from the network unless asked for.
    listen: Annotated[str, Check(parse_listen)] = DEFAULT_LISTEN
    # Quarantines, the journal and rates across restarts live here.
    state_dir: str = DEFAULT_STATE_DIR
    # How much history each subject keeps for the checks' windows.
    history: Seconds = 3600.0
    log_level: str = "info"
    # Journal entries older than this are deleted (hourly), so that the state
    # database stays bounded; gpuwatchd's own drain records are kept.
    journal_retention: Annotated[Seconds, Check(_retention)] = 90 * 86400.0

    def __post_init__(self) -> None:
        if self.poll_interval < MIN_POLL_INTERVAL:
            raise ValueError(
                f"the poll interval must be at least {MIN_POLL_INTERVAL:g}s (less is a busy loop)"
            )
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be {', '.join(LOG_LEVELS)}, got {self.log_level!r}")


@dataclass(frozen=True)
class ApiConfig:
    # The bearer tokens that writes need, one a line: `name:secret` or `secret`.
    # null: <state_dir>/api-token, created (mode 0600) with a random secret at
    # the first start.
    token_file: str | None = None
    # Serve HTTPS with this certificate (PEM, chain included) and its key;
    # both or neither.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # A write request's body may be at most this long.
    max_body_bytes: int = 65536
    # Connections each listener serves at once (a thread and a descriptor
    # each): well under the 1024 descriptors systemd gives a service, so
    # that a flood cannot starve the sources of descriptors. When all are
    # taken, the one waiting longest for its request is closed for a new one;
    # when every one is being answered, new ones wait in the listen backlog.
    max_connections: int = 256
    # A connection's request line and headers (and TLS handshake) must come
    # within this of its accept, or it is closed: any HTTP client sends them
    # at once, so this cuts off only idle and trickling connections (a
    # slowloris). 5 s: the read timeout of Cloudflare's guide to Go's net/http
    # timeouts; a few round trips across sites fit in it many times over.
    header_timeout: Seconds = 5.0
    # HOST:PORT for the control API (/api/v1/) apart from /metrics: with it
    # set, daemon.listen serves /metrics, /healthz and /api/v1/status only,
    # and can be the cluster address while the API stays on loopback; or
    # unix:/run/gpuwatchd/api.sock, a Unix socket of mode 0660 (the daemon's
    # user and group). null: the API is served on daemon.listen.
    listen: str | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be more than 0")
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise ValueError(
                f"max_connections must be 1 to {MAX_CONNECTIONS} (a thread and a descriptor "
                f"each), got {self.max_connections}"
            )
        if self.header_timeout <= 0:
            raise ValueError("header_timeout must be more than 0s")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.listen is None:
            return
        path = unix_socket_path(self.listen)
        if path is None:
            parse_listen(self.listen)
        elif not os.path.isabs(path):
            raise ValueError(
                "a Unix socket is an absolute path such as unix:/run/gpuwatchd/api.sock, "
                f"got {self.listen!r}"
            )
        elif len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
            raise ValueError(
                f"a Unix socket's path is at most {MAX_UNIX_PATH_BYTES} bytes (unix(7)), "
                f"got {len(os.fsencode(path))}: {path}"
            )
        elif self.tls_cert_file:
            raise ValueError(
                "the API on a Unix socket is plain HTTP (its file mode guards it): "
                "leave tls_cert_file out, or listen on HOST:PORT"
            )


@dataclass(frozen=True)
class SourcesConfig:
    nvml: NvmlSourceConfig = field(default_factory=NvmlSourceConfig)
    infiniband: InfinibandSourceConfig = field(default_factory=InfinibandSourceConfig)
    pcie: PcieSourceConfig = field(default_factory=PcieSourceConfig)

    def __post_init__(self) -> None:
        # The daemon runs from / (systemd's default) and the CLI from anywhere:
        # a relative path would name another file to each.
        log = self.nvml.kernel_log
        if log is not None and not os.path.isabs(log):
            raise ValueError(f"nvml.kernel_log must be an absolute path, got {log!r}")


@dataclass(frozen=True)
class ActionsConfig:
    # The node's name in webhook events; null: the hostname.
    node_name: str | None = None
    # Where a receiver's people can reach this daemon (links in payloads);
    # null: http://<node_name>:<listen port>.
    external_url: str | None = None
    webhooks: tuple[WebhookConfig, ...] = ()
    # Dead-lettered webhook events are kept this long for `status`.
    dead_letter_retention: Seconds = 7 * 86400.0
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    fleet_safety: FleetSafetyConfig = field(default_factory=FleetSafetyConfig)

    def __post_init__(self) -> None:
        names = [webhook.name for webhook in self.webhooks]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"webhook names must be unique: {', '.join(twice)}")
        fleet = self.fleet_safety
        if fleet.enabled and not fleet.prometheus_url and not fleet.fail_open:
            draining = [
                name
                for name, scheduler in (("slurm", self.slurm), ("kubernetes", self.kubernetes))
                if scheduler.enabled and not scheduler.dry_run
            ]
            if draining:
                raise ValueError(
                    f"fleet_safety.prometheus_url is required with {' and '.join(draining)} "
                    "enabled: fleet safety asks it before every automatic drain, and without "
                    "it every one is held back; set it, or fleet_safety.enabled: false"
                )


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    def __post_init__(self) -> None:
        if self.api.max_body_bytes > MAX_BODY_BYTES:
            raise ValueError(f"api.max_body_bytes must be at most {MAX_BODY_BYTES} (1 MiB)")
        window, needed = max(_history_needs(self.checks).items(), key=lambda item: item[1])
        if self.daemon.history < needed:
            raise ValueError(
                f"daemon.history is {format_duration(self.daemon.history)}, shorter than "
                f"{window} ({format_duration(needed)}): that check could never see a full "
                "window"
            )

    @property
    def token_file(self) -> str:
        """The API token file: configured, or in the state directory."""
        return self.api.token_file or os.path.join(self.daemon.state_dir, API_TOKEN_NAME)

    def enabled_sources(self) -> tuple[str, ...]:
        enabled = {
            "nvml": self.sources.nvml.enabled,
            "infiniband": self.sources.infiniband.enabled,
            "pcie": self.sources.pcie.enabled,
            "canary": self.canary.enabled,
        }
        return tuple(name for name in SOURCE_NAMES if enabled[name])

    def only_sources(self, names: tuple[str, ...]) -> Config:
        """The same settings with exactly `names` enabled (`run --source`)."""
        unknown = set(names) - set(SOURCE_NAMES)
        if unknown:
            raise ValueError(f"unknown source(s): {', '.join(sorted(unknown))}")
        sources = replace(
            self.sources,
            nvml=replace(self.sources.nvml, enabled="nvml" in names),
            infiniband=replace(self.sources.infiniband, enabled="infiniband" in names),
            pcie=replace(self.sources.pcie, enabled="pcie" in names),
        )
        return replace(
            self, sources=sources, canary=replace(self.canary, enabled="canary" in names)
        )


def _history_needs(checks: ChecksConfig) -> dict[str, float]:
    """How far back each check reads the history."""
    return {
        "checks.thermal.window": checks.thermal.window,
        "checks.clocks.window * critical_windows": (
            checks.clocks.window * checks.clocks.critical_windows
        ),
        "checks.nvlink.window * storm_windows": checks.nvlink.window * checks.nvlink.storm_windows,
        "checks.memory.window": checks.memory.window,
        "checks.pcie.window * critical_windows": checks.pcie.window * checks.pcie.critical_windows,
        "checks.pcie.replay_window": checks.pcie.replay_window,
        "checks.fabric.registration_timeout": checks.fabric.registration_timeout,
        "checks.xid.window": checks.xid.window,
        "checks.infiniband.flap_window": checks.infiniband.flap_window,
        "checks.infiniband.ber_window": checks.infiniband.ber_window,
        "checks.infiniband.congestion_window": checks.infiniband.congestion_window,
        "checks.aer.window": checks.aer.window,
        "checks.aer.correctable_window": checks.aer.correctable_window,
    }


def load_config(path: str | None) -> Config:
    """The config at `path`; the defaults when `path` is None."""
    return Config() if path is None else load_file(Config, path)


def parse_config(text: str, filename: str = "<config>") -> Config:
    return load(Config, text, filename)
