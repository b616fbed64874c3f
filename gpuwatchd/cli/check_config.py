"""`gpuwatchd check-config`: a config file validated away from any daemon,
exit 0 or the file, line and key that is wrong."""

from __future__ import annotations

import sys

import click

from gpuwatchd.actions.webhook import unreadable_files
from gpuwatchd.config import load_config
from gpuwatchd.settings import SettingsError


@click.command("check-config")
@click.argument("path", type=click.Path(dir_okay=False))
def check_config(path: str) -> None:
    """Validate a config file: exit 0, or name the file, line and key that is wrong.

    Files the config names that cannot be read on this host (a webhook's
    secret) are warnings: a config is also checked away from its nodes."""
    try:
        config = load_config(path)
    except SettingsError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    for webhook in config.actions.webhooks:
        for problem in unreadable_files(webhook):
            click.echo(f"warning: {problem} here", err=True)
    click.echo(f"{path}: ok")
