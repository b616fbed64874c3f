"""`canary`: run the canary suite once, in the foreground.

For Slurm prolog/epilog scripts and burn-in: runs every canary on the chosen
GPUs (each in its own worker process, all GPUs at once, with the daemon's
hard timeout), and with `--gpu all` on the host's CPU cores too, each pinned
in turn. Exit status, most specific first: 1 when any canary gave a wrong
answer, 2 when the suite could not run (no backend, no such GPU, a bad
scenario, a canary that crashed or hung), 0 when everything passed.

`--simulate SCENARIO` runs against a simulated node: the CPU backend stands
in for each of its GPUs, and its `sdc` faults (all of them, whatever their
`at`) corrupt the GPUs they name. The simulated node is the assembly's to
describe (`canary_command`'s `simulated_node`, gpuwatchd/assemble.py): the
canaries never read a scenario themselves.

`--dcgm LEVEL` is the offline tier instead: DCGM's diagnostic on the chosen
GPUs, exit 1 when a test failed and 2 when it could not run. The tier is the
caller's to give (`canary_command`'s `dcgm_tier`: gpuwatchd/dcgm/tier.py,
which records the run for `gpuwatchd report`).

A click command built by `canary_command`: a subcommand of `gpuwatchd`, or
standalone, without `--simulate` and `--dcgm`, as `python -m gpuwatchd.canary.cli`.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import IO, NoReturn

import click

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.crosscheck import DigestBook, crosscheck
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.modes import NvmlCannotStart, compute_capability, nvml_gpus
from gpuwatchd.canary.result import CanaryResult
from gpuwatchd.canary.runner import BurstRequest, probe_cuda, run_burst
from gpuwatchd.canary.spec import default_suite, host_suite, long_suite
from gpuwatchd.canary.wire import to_wire
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import STATE_DIR_ENV
from gpuwatchd.sources import PcieSourceConfig
from gpuwatchd.sources.pcie import nvidia_gpus_on_bus
from gpuwatchd.units import parse_duration

EXIT_PASS = 0
EXIT_MISMATCH = 1
EXIT_CANNOT_RUN = 2
# How long finding out whether CUDA is there may take (CuPy's import and the
# driver's start).
PROBE_TIMEOUT_S = 60.0
# Hard limit on one round of `--long` on one GPU (its inputs, five formats'
# sustained GEMMs and the sampled fp64 check).
LONG_TIMEOUT_S = 600.0


class CannotRun(click.ClickException):
    exit_code = EXIT_CANNOT_RUN


@dataclass(frozen=True)
class SimulatedGpu:
    """One GPU of a simulated node, as the CPU backend stands in for it."""

    model: str
    sm_count: int
    compute_capability: tuple[int, int] | None
    faults: tuple[FaultSpec, ...]


# A scenario's name or file -> its GPUs in index order; ValueError for a bad
# scenario or a model with no simulated hardware.
SimulatedNode = Callable[[str], Sequence[SimulatedGpu]]


@dataclass(frozen=True)
class DcgmRequest:
    """What `canary --dcgm` was asked: the level, the GPUs (N or all), a
    scenario to run on, JSON output, and the config and state directory the
    run is recorded through."""

    level: int
    gpu: str
    simulate: str | None
    as_json: bool
    config_path: str | None
    state_dir: str | None


# Runs the offline tier; its exit status.
DcgmTier = Callable[[DcgmRequest], int]


@dataclass(frozen=True)
class Plan:
    requests: tuple[BurstRequest, ...]
    timeout: float
    # Why no GPU is in the plan, on a host that has none; None where GPUs are.
    no_gpu: str | None = None


def gpu_choice(value: str, available: Sequence[int]) -> list[int]:
    if value == "all":
        return list(available)
    if not value.isdigit():
        raise CannotRun(f"--gpu takes a GPU index or 'all', not {value!r}")
    if int(value) not in available:
        raise CannotRun(
            f"there is no GPU {value} (GPUs: {', '.join(map(str, available)) or 'none'})"
        )
    return [int(value)]


def _simulated_plan(
    gpu: str, backend: str, name: str, config: CanaryConfig, simulated_node: SimulatedNode
) -> Plan:
    if backend == "cuda":
        raise CannotRun("a simulated node runs on the cpu backend, not cuda")
    try:
        node = simulated_node(name)
    except ValueError as error:  # a bad scenario, a model with no simulated hardware
        raise CannotRun(str(error)) from error
    requests = []
    for index in gpu_choice(gpu, range(len(node))):
        simulated = node[index]
        # The simulated model's capability: a simulated V100 runs no tensor-core tile.
        suite = default_suite(
            "cpu", config.seed, config.seed, config.hbm_bytes, simulated.compute_capability
        )
        requests.append(
            BurstRequest(
                "cpu",
                suite,
                gpu=index,
                stand_in_model=simulated.model,
                stand_in_sm_count=simulated.sm_count,
                faults=simulated.faults,
            )
        )
    return Plan(tuple(requests), config.timeout)


@dataclass(frozen=True)
class _Gpus:
    """NVML index -> UUID of the GPUs the CUDA backend checks, and, where
    there is none, why."""

    uuids: dict[int, str | None]
    none_because: str | None = None


def _cuda_gpus(backend: str, gpu: str, sysfs_root: str) -> _Gpus:
    """The GPUs the CUDA backend checks. A node whose GPUs NVML sees and CUDA
    cannot use, or whose PCI bus has NVIDIA GPUs NVML cannot see, is never
    passed silently; a host with none says so."""
    if backend == "cpu":
        return _Gpus({}, "--backend cpu")
    no_gpu = "NVML sees no GPU"
    try:
        nvml = dict(nvml_gpus())
    except NvmlCannotStart as error:
        on_bus = nvidia_gpus_on_bus(sysfs_root)
        if on_bus:
            raise CannotRun(
                f"NVML cannot start ({error}) and the PCI bus has {len(on_bus)} NVIDIA GPU(s) "
                f"({', '.join(on_bus)}): no GPU was checked; see the driver's install (a "
                "driver upgraded without a reboot needs one)"
            ) from error
        nvml = {}
        no_gpu = f"NVML cannot start ({error}) and the PCI bus under {sysfs_root} has no NVIDIA GPU"
    try:
        probed = probe_cuda(PROBE_TIMEOUT_S)
    except RuntimeError as error:
        if nvml:
            raise CannotRun(
                f"{len(nvml)} GPU(s) and no working CUDA backend ({error}); "
                "install gpuwatchd's cuda extra (README, Install)"
            ) from error
        if backend == "cuda" or gpu != "all":
            # No GPU is the cause; the CUDA backend's own complaint comes second.
            raise CannotRun(
                f"no GPU to check here: {no_gpu} (CUDA: {error}); `--backend cpu` checks "
                "the host's cores"
            ) from error
        return _Gpus({}, f"{no_gpu} (CUDA: {error})")
    if nvml and len(probed) != len(nvml):
        raise CannotRun(f"NVML sees {len(nvml)} GPU(s), CUDA {len(probed)}")
    return _Gpus(nvml or {g.index: None for g in probed})


def _node_plan(gpu: str, backend: str, config: CanaryConfig, sysfs_root: str) -> Plan:
    found = _cuda_gpus(backend, gpu, sysfs_root)
    uuids = found.uuids
    requests = [
        BurstRequest(
            "cuda",
            default_suite(
                "cuda", config.seed, config.seed, config.hbm_bytes, compute_capability(index)
            ),
            gpu=index,
            uuid=uuids[index],
        )
        for index in gpu_choice(gpu, sorted(uuids))
    ]
    if gpu == "all":
        cores = tuple(sorted(os.sched_getaffinity(0)))
        requests.append(BurstRequest("cpu", host_suite(config.seed), cpu_cores=cores))
    return Plan(tuple(requests), config.timeout, None if uuids else found.none_because)


def _where(result: CanaryResult) -> str:
    return f"cpu {result.cpu_core}" if result.cpu_core is not None else f"gpu {result.gpu}"


def describe(result: CanaryResult) -> str:
    """One line about one canary run."""
    line = f"{_where(result):>7}  {result.canary:<26} {result.result:<8} "
    line += f"{result.duration_seconds * 1000:9.1f} ms"
    if result.tflops is not None:
        line += f"  {result.tflops:8.3f} TFLOP/s"
    if result.result == "mismatch" and result.first_mismatch_index is not None:
        line += (
            f"  {result.mismatch_count} wrong, first at {result.first_mismatch_index}: "
            f"{result.first_actual_bits} instead of {result.first_expected_bits}"
        )
        if result.mismatch_units:
            units, lanes = _short(result.mismatch_units), _short(result.mismatch_lanes)
            line += f" (SMs/cores {units}, lanes {lanes})"
    elif result.message:
        line += f"  {result.message}"
    return line


def _short(values: Sequence[int]) -> str:
    shown = ",".join(map(str, values[:8]))
    return shown + (",..." if len(values) > 8 else "")


def _run(plan: Plan, to: IO[str] | None) -> tuple[list[CanaryResult], list[CanaryResult]]:
    """Every result, and those the cross-GPU comparison changed; a line per
    canary goes to `to` as each result arrives."""
    clock = SystemClock()
    lock = threading.Lock()

    def progress(result: CanaryResult) -> None:
        if to is not None:
            with lock:
                click.echo(describe(result), file=to)

    def one(request: BurstRequest) -> list[CanaryResult]:
        outcome = run_burst(request, timeout=plan.timeout, clock=clock, on_result=progress)
        return list(outcome.results)

    with ThreadPoolExecutor(max_workers=max(1, len(plan.requests))) as pool:
        bursts = list(pool.map(one, plan.requests))
    results = [result for burst in bursts for result in burst]
    gpus = {result.gpu for result in results if result.gpu is not None}
    _, judged = crosscheck(DigestBook(), results, quorum=2 if len(gpus) > 1 else 1)
    changed = [after for before, after in zip(results, judged, strict=True) if after != before]
    return list(judged), changed


def _duration(value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as error:
        raise CannotRun(f"--long: {error}") from error


def _burn(plan: Plan, seconds: float, to: IO[str] | None) -> list[CanaryResult]:
    """Rounds of the burn-in tier on the plan's GPUs, until `seconds` have
    passed (at least one round) or a round did not pass."""
    gpus = [request for request in plan.requests if request.gpu is not None]
    if not gpus:
        raise CannotRun("--long runs on GPUs, and there is none to run on")
    deadline = time.monotonic() + seconds
    results: list[CanaryResult] = []
    for seed in itertools.count(1):
        specs = {request.gpu: long_suite(request.backend, seed) for request in gpus}
        # Each round is a burst of its own: a simulated fault draws afresh.
        round_plan = Plan(
            tuple(replace(request, specs=specs[request.gpu], fault_draw=seed) for request in gpus),
            max(plan.timeout, LONG_TIMEOUT_S),
        )
        done, _ = _run(round_plan, to)
        results.extend(done)
        if exit_status(done) != EXIT_PASS or time.monotonic() >= deadline:
            break
    return results


def exit_status(results: Sequence[CanaryResult]) -> int:
    if any(result.result == "mismatch" for result in results):
        return EXIT_MISMATCH
    if not results or any(result.result in ("error", "timeout") for result in results):
        return EXIT_CANNOT_RUN
    return EXIT_PASS


def canary_command(
    simulated_node: SimulatedNode | None = None, dcgm_tier: DcgmTier | None = None
) -> click.Command:
    """The `canary` command; `simulated_node` describes the GPUs of a
    scenario for `--simulate`, `dcgm_tier` runs `--dcgm` (None: neither here)."""

    @click.command("canary")
    @click.option(
        "--gpu",
        "gpu",
        default="all",
        metavar="N|all",
        show_default=True,
        help="The GPU to check; `all` also checks the host's CPU cores.",
    )
    @click.option(
        "--backend",
        type=click.Choice(["auto", "cuda", "cpu"]),
        default="auto",
        show_default=True,
        help="cuda (CuPy), cpu (the host's cores; a simulated node's GPUs), or auto.",
    )
    @click.option(
        "--simulate",
        metavar="SCENARIO",
        help="Run on a simulated node: a built-in scenario name or a scenario file.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the results as a JSON list.")
    @click.option(
        "--long",
        "burn",
        metavar="DURATION",
        help="Burn-in or a maintenance window: instead of the suite, sustained full-power GEMMs "
        "of randomized inputs in every format for DURATION (e.g. 30m), a fresh seed each round; "
        "stops at the first wrong answer.",
    )
    @click.option(
        "--dcgm",
        "dcgm_level",
        type=click.IntRange(1, 4),
        metavar="LEVEL",
        help="Instead of the canaries: DCGM's diagnostic (dcgmi diag -r LEVEL, 1-4) on the "
        "chosen GPUs, recorded for `gpuwatchd report`. It takes the GPUs: a Slurm epilog or a "
        "maintenance window, not beside a job.",
    )
    @click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="With --dcgm: the config (canary.dcgm, and the daemon and state directory the "
        "run is recorded through).",
    )
    @click.option(
        "--state-dir",
        type=click.Path(file_okay=False),
        envvar=STATE_DIR_ENV,
        show_envvar=True,
        help="With --dcgm: the state directory the run is recorded in when the daemon is not "
        "running.",
    )
    @click.option(
        "--sysfs-root",
        default=PcieSourceConfig().sysfs_root,
        show_default=True,
        type=click.Path(file_okay=False),
        help="Where the PCI bus is read to tell a node with GPUs when NVML cannot start.",
    )
    def canary(
        gpu: str,
        backend: str,
        simulate: str | None,
        as_json: bool,
        burn: str | None,
        dcgm_level: int | None,
        config_path: str | None,
        state_dir: str | None,
        sysfs_root: str,
    ) -> None:
        """Run the known-answer canary suite once and report every result (or,
        with --dcgm, DCGM's diagnostic)."""
        if dcgm_level is None:
            run_once(gpu, backend, simulate, as_json, burn, sysfs_root, simulated_node)
        if burn is not None:
            raise CannotRun("--dcgm and --long are two offline tiers: run one at a time")
        if dcgm_tier is None:
            raise CannotRun("--dcgm needs gpuwatchd: run it as `gpuwatchd canary --dcgm`")
        request = DcgmRequest(dcgm_level, gpu, simulate, as_json, config_path, state_dir)
        sys.exit(dcgm_tier(request))

    return canary


def run_once(
    gpu: str,
    backend: str,
    simulate: str | None,
    as_json: bool,
    burn: str | None,
    sysfs_root: str,
    simulated_node: SimulatedNode | None,
) -> NoReturn:
    """The command's work; exits with the run's status."""
    config = CanaryConfig()
    if simulate is None:
        plan = _node_plan(gpu, backend, config, sysfs_root)
    elif simulated_node is None:
        raise CannotRun("--simulate needs the simulator: run it as `gpuwatchd canary --simulate`")
    else:
        plan = _simulated_plan(gpu, backend, simulate, config, simulated_node)
    if not plan.requests:
        raise CannotRun("nothing to run the canaries on")
    # Without --json the lines are the report (stdout); with it, progress
    # for a terminal only.
    to = sys.stdout if not as_json else (sys.stderr if sys.stderr.isatty() else None)
    if burn is None:
        results, changed = _run(plan, to)
    else:
        results, changed = _burn(plan, _duration(burn), to), []
    if as_json:
        click.echo(json.dumps([to_wire(result) for result in results], indent=1))
    else:
        for result in changed:
            click.echo(describe(result))
        click.echo(_verdict(results))
    if plan.no_gpu is not None:
        # The host's cores passing says nothing of a GPU (review first-day-2, M2).
        click.echo(f"no GPU was checked, only the host's CPU cores: {plan.no_gpu}", err=True)
    sys.exit(exit_status(results))


def _verdict(results: Sequence[CanaryResult]) -> str:
    said = {"mismatch": "mismatched", "error": "could not run", "timeout": "timed out"}
    counts = {o: sum(r.result == o for r in results) for o in said}
    if not any(counts.values()):
        return f"all {len(results)} canaries passed"
    return f"of {len(results)} canaries, " + ", ".join(
        f"{n} {said[o]}" for o, n in counts.items() if n
    )


if __name__ == "__main__":
    canary_command()()
