"""`gpuwatchd canary`: the canaries' one-shot command (gpuwatchd/canary/cli.py),
with the simulated node the assembly describes, and the DCGM tier recording
its runs through the daemon or in its state database."""

from __future__ import annotations

import functools

from gpuwatchd.actions.client import Offline
from gpuwatchd.assemble import simulated_canary_node
from gpuwatchd.canary.cli import canary_command
from gpuwatchd.canary.wire import to_wire
from gpuwatchd.cli.common import read_config
from gpuwatchd.cli.target import Target, daemon_client, daemon_or_database
from gpuwatchd.config import Config
from gpuwatchd.dcgm import DcgmRun
from gpuwatchd.dcgm.tier import DcgmHost, run_tier
from gpuwatchd.server import DCGM_RUNS


def _record_dcgm(config: Config, run: DcgmRun) -> str:
    """Where `canary --dcgm` keeps a run: through the daemon, which holds the
    state database while it runs, else in the database."""
    target = Target(
        config, daemon_client(config, None), False, config.token_file, config.daemon.state_dir
    )

    def remote() -> str:
        answer = target.client.send("POST", DCGM_RUNS, to_wire(run), target.secret())
        return f"recorded by the daemon at {target.client.url} (run {answer['id']})"

    def local(offline: Offline) -> str:
        return f"recorded in {offline.store.path} (run {offline.record_dcgm(run)})"

    return daemon_or_database(target, remote, local)


# The canaries' one-shot command, with the simulated node the assembly
# describes and the DCGM tier recording through this command's config.
canary = canary_command(
    simulated_canary_node, functools.partial(run_tier, DcgmHost(read_config, _record_dcgm))
)
