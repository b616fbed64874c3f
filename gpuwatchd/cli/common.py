"""What the command groups share before any daemon is asked: the config a
command reads (--config, else the system file), the options naming a
config, a daemon or a state directory, durations given as flags, and the
flags with which `run` and `capture` override the config."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import click

from gpuwatchd.config import DEFAULT_CONFIG_PATH, STATE_DIR_ENV, Config, load_config, parse_listen
from gpuwatchd.settings import SettingsError
from gpuwatchd.units import parse_duration

T = TypeVar("T")

# What an option adds to a command.
OptionDecorator = Callable[[Callable[..., None]], Callable[..., None]]

# What a simulated daemon prints for the CLI in another terminal to find it
# (and STATE_DIR_ENV, config.py's).
NODE_ENV = "GPUWATCHD_NODE"


def _config_path(path: str | None) -> str | None:
    """An explicit --config, else the system file when it exists, else defaults."""
    if path is not None:
        return path
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None


def read_config(path: str | None) -> Config:
    """The config of --config `path` (see _config_path); a bad one is the command's error."""
    try:
        return load_config(_config_path(path))
    except SettingsError as error:
        raise click.ClickException(str(error)) from error


def duration_value(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """An option's duration (10s, 2m) in seconds: a click callback."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


def _flag(flag: str, make: Callable[[], T]) -> T:
    """`make()`; its ValueError is the flag's, named as such, not the config key's."""
    try:
        return make()
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=f"'{flag}'") from error


def apply_overrides(
    config: Config,
    listen: str | None,
    state_dir: str | None,
    interval: float | None,
    sources: tuple[str, ...],
    sysfs_root: str | None,
) -> Config:
    """`config` with what the flags of `run` (or `capture`) say instead."""
    daemon = config.daemon
    if listen is not None:
        _flag("--listen", lambda: parse_listen(listen))
        daemon = replace(daemon, listen=listen)
    if state_dir is not None:
        daemon = replace(daemon, state_dir=state_dir)
    if interval is not None:
        daemon = _flag("--interval", lambda: replace(daemon, poll_interval=interval))
    if sources:
        config = _flag("--source", lambda: config.only_sources(sources))
    chosen = config.sources
    if sysfs_root is not None:
        chosen = replace(
            chosen,
            infiniband=replace(chosen.infiniband, sysfs_root=sysfs_root),
            pcie=replace(chosen.pcie, sysfs_root=sysfs_root),
        )
    return replace(config, daemon=daemon, sources=chosen)


def config_option() -> OptionDecorator:
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), help="Config file."
    )


def node_option(help_text: str) -> OptionDecorator:
    return click.option("--node", "node_url", envvar=NODE_ENV, show_envvar=True, help=help_text)


def state_dir_option(help_text: str) -> OptionDecorator:
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False),
        envvar=STATE_DIR_ENV,
        show_envvar=True,
        help=help_text,
    )
