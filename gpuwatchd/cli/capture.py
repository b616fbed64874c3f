"""`gpuwatchd capture`: every answer this node's NVML and InfiniBand
sources get, in one file a scenario can run on; and the node a command
reads, this one or a simulated one (capture and report)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

import click

from gpuwatchd import capture as captures
from gpuwatchd import logs
from gpuwatchd.assemble import simulated_node
from gpuwatchd.cli.common import apply_overrides, config_option, read_config
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import Config
from gpuwatchd.sim.scenario import ScenarioError


@click.command("capture")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    help="Write the capture to this file (default: standard output).",
)
@config_option()
@click.option(
    "--sysfs-root",
    type=click.Path(file_okay=False),
    help="Read InfiniBand, and look for GPUs on the PCI bus, under this root.",
)
@click.option(
    "--polls",
    type=click.IntRange(1, 10),
    default=captures.DEFAULT_POLLS,
    show_default=True,
    help="How many polls to record.",
)
@click.option(
    "--anonymize", is_flag=True, help="Replace GPU UUIDs and HCA node GUIDs with pseudonyms."
)
@click.option(
    "--simulate",
    "simulated",
    metavar="SCENARIO",
    help="Capture a simulated node instead (a scenario file or built-in name).",
)
def capture(
    out: str,
    config_path: str | None,
    sysfs_root: str | None,
    polls: int,
    anonymize: bool,
    simulated: str | None,
) -> None:
    """Record every answer this node's NVML and InfiniBand sources get, in one
    file a scenario can run on (`node: {capture: FILE}`; docs/capture.md)."""
    config = apply_overrides(read_config(config_path), None, None, None, (), sysfs_root)
    logs.setup(config.daemon.log_level, journal=False)
    clock = SystemClock()
    with ExitStack() as stack:
        config, before_poll = node_to_read(stack, config, clock, simulated)
        document = captures.capture_node(config, clock, polls, before_poll)
    if anonymize:
        document = captures.anonymize(document)
    with click.open_file(out, "w", encoding="utf-8", atomic=out != "-") as stream:
        stream.write(captures.dumps(document))
    click.echo(f"captured {captures.summary(document)}", err=True)
    missing = captures.nvml_missing(document)
    if missing is not None:
        # The file says why, for a report; a script must not take it for a node's capture.
        raise click.ClickException(
            f"no GPU was captured: {missing} (a config with sources.nvml.enabled: false "
            "captures InfiniBand alone; --simulate SCENARIO, a simulated node)"
        )


def node_to_read(
    stack: ExitStack, config: Config, clock: SystemClock, simulated: str | None
) -> tuple[Config, Callable[[float], None] | None]:
    """This node (`simulated` None), or the simulated node of that scenario
    until `stack` closes: the config that reads it, and what moves it."""
    if simulated is None:
        return config, None
    try:
        return simulated_node(stack, config, clock, simulated)
    except ScenarioError as error:
        raise click.ClickException(str(error)) from error
