"""`gpuwatchd canary --dcgm LEVEL`: DCGM's diagnostic on the chosen GPUs,
said, and recorded for `gpuwatchd report`.

The canary command takes this tier from `gpuwatchd` (`canary_command`'s
`dcgm_tier`), which gives it its config and a way to the daemon or the state
database (`DcgmHost`); the canaries themselves know nothing of DCGM, nor of
the simulator a `--simulate` run reads its GPUs from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace

import click

from gpuwatchd import dcgm
from gpuwatchd.assemble import simulated_node
from gpuwatchd.canary.cli import CannotRun, DcgmRequest, gpu_choice
from gpuwatchd.canary.wire import to_wire
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import Config
from gpuwatchd.dcgm.run import DcgmRun
from gpuwatchd.evidence import BoardIdentity
from gpuwatchd.inventory import Inventory, read_inventory
from gpuwatchd.settings import SettingsError
from gpuwatchd.sim.scenario import ScenarioError
from gpuwatchd.status import finding_json


@dataclass(frozen=True)
class DcgmHost:
    """What `gpuwatchd` gives the tier: its config (the file given, else the
    system's), and how a run is recorded (through the daemon, else in the
    state database), with a line saying where."""

    load_config: Callable[[str | None], Config]
    record: Callable[[Config, DcgmRun], str]


def run_tier(host: DcgmHost, request: DcgmRequest) -> int:
    """Run DCGM's diagnostic, say what it found, record it; the exit status."""
    try:
        config = host.load_config(request.config_path)
    except SettingsError as error:
        raise CannotRun(str(error)) from error
    if request.state_dir is not None:
        config = replace(config, daemon=replace(config.daemon, state_dir=request.state_dir))
    clock = SystemClock()
    with ExitStack() as stack:
        nvml = config.sources.nvml
        if request.simulate is not None:
            try:
                nvml = simulated_node(stack, config, clock, request.simulate)[0].sources.nvml
            except ScenarioError as error:
                raise CannotRun(str(error)) from error
        boards = _boards(request.gpu, read_inventory(clock, nvml))
        run = dcgm.run_diagnostic(config.canary.dcgm, request.level, boards)
    found = dcgm.findings(run)
    if request.as_json:
        document = {"run": to_wire(run), "findings": [finding_json(f) for f in found]}
        click.echo(json.dumps(document, indent=1, sort_keys=True))
    else:
        for line in dcgm.describe(run):
            click.echo(line)
    _record(host, config, run)
    return run.exit_code


def _boards(gpu: str, inventory: Inventory) -> list[BoardIdentity]:
    if inventory.unavailable is not None:
        raise CannotRun(
            f"NVML shows no GPU ({inventory.unavailable}); DCGM's diagnostic runs on "
            "NVML's GPUs, and a finding needs the board's UUID"
        )
    indices = gpu_choice(gpu, [board.index for board in inventory.boards])
    return [board for board in inventory.boards if board.index in indices]


def _record(host: DcgmHost, config: Config, run: DcgmRun) -> None:
    """Record the run for `gpuwatchd report`; a run that never started (no
    dcgmi) says nothing of the boards and is not kept. Not being kept does
    not change the verdict: that is said on stderr."""
    if not run.started:
        return
    try:
        click.echo(host.record(config, run), err=True)
    except click.ClickException as error:
        click.echo(f"warning: the DCGM run was not recorded: {error.message}", err=True)
