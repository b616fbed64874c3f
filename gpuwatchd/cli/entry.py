"""The `gpuwatchd` command group itself: its help, --version, and the help
when no command is given. Its commands are added in gpuwatchd/cli/__init__.py,
one module a command group."""

from __future__ import annotations

import click

from gpuwatchd import version


def _show_version(ctx: click.Context, _: click.Parameter, wanted: bool) -> None:
    # A callback, not click.version_option: the build is found (BUILD file,
    # or git in a checkout) only when asked for, never at import.
    if wanted and not ctx.resilient_parsing:
        click.echo(f"gpuwatchd {version.describe()}")
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and the build it is (package, git commit), and exit.",
)
@click.pass_context
def main(ctx: click.Context) -> None:
    """GPU cluster health agent: reads NVML and InfiniBand, judges health,
    exports it to Prometheus and acts on quarantine decisions."""
    if ctx.invoked_subcommand is None:
        # Asked for nothing: the help is the answer, not a usage error.
        click.echo(ctx.get_help())
