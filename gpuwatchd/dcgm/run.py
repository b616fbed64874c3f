"""One DCGM diagnostic: running `dcgmi diag -r LEVEL -i GPUS -j` within its
limit, judging its JSON, and the `DcgmRun` that records it.

Judged as DCGM's own tests judge it (testing/python3/DcgmiDiag.py,
FindFailedTests): a test failed where one of its results, or its
`test_summary`, has the status "Fail", whatever dcgmi's exit status; a
`runtime_error` is a diagnostic that did not run. DCGM's GPU id is mapped to
the board by the serial number DCGM lists for it (`entity_groups`:
nvmlDeviceGetSerial, as DCGM reads it), else by the NVML index, which is the
id DCGM gives a GPU when its host engine starts (DCGM 4.6,
dcgmlib/src/DcgmCacheManager.cpp); `-i` is given NVML indices for the same
reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpuwatchd.canary.config import DCGM_LEVELS, DcgmConfig
from gpuwatchd.canary.wire import from_wire, to_wire
from gpuwatchd.dcgm.output import (
    DcgmResult,
    OutputError,
    gpu_entities,
    parse_output,
    results_of,
    version,
)
from gpuwatchd.evidence import BoardIdentity
from gpuwatchd.process import Finished, TimedOut, run_bounded
from gpuwatchd.store import Store

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_CANNOT_RUN = 2
# What the record keeps of dcgmi's output that is no diagnostic, and of its
# standard error: enough to tell why, bounded for the state database.
MAX_TEXT_CHARS = 16384
HOST_ENGINE_HINT = (
    "is DCGM's host engine running? `systemctl status nvidia-dcgm`, or start nv-hostengine"
)

Outcome = Literal["pass", "fail", "cannot_run"]
EXIT_STATUSES: Mapping[str, int] = {
    "pass": EXIT_PASS,
    "fail": EXIT_FAIL,
    "cannot_run": EXIT_CANNOT_RUN,
}


@dataclass(frozen=True)
class DcgmBoard:
    """A board the run was asked to diagnose, and what DCGM said of it."""

    uuid: str
    index: int
    serial: str | None
    outcome: Outcome
    dcgm_gpu_id: int | None = None
    # How DCGM's GPU id was told to be this board.
    matched_by: Literal["serial", "index"] | None = None


@dataclass(frozen=True)
class DcgmRun:
    time: float
    level: int
    command: tuple[str, ...]
    outcome: Outcome
    duration_seconds: float
    boards: tuple[DcgmBoard, ...]
    reason: str | None = None  # why it could not run
    exit_status: int | None = None
    dcgm_version: str | None = None
    results: tuple[DcgmResult, ...] = ()
    # dcgmi's output: its JSON (compact) when it was a diagnostic, else the
    # text as printed; and its standard error.
    output: str | None = None
    errors: str | None = None
    # Whether dcgmi ran at all (it was there, and started): a run that never
    # started says nothing of the boards and is not recorded.
    started: bool = True

    def __post_init__(self) -> None:
        if self.level not in DCGM_LEVELS:
            raise ValueError(f"level must be one of {', '.join(map(str, DCGM_LEVELS))}")
        if not self.boards or not all(board.uuid for board in self.boards):
            raise ValueError("a run names the boards it ran on, each by its UUID")

    @property
    def exit_code(self) -> int:
        return EXIT_STATUSES[self.outcome]

    def board(self, uuid: str | None) -> DcgmBoard | None:
        return next((b for b in self.boards if b.uuid == uuid), None)


def command(config: DcgmConfig, level: int, boards: Sequence[BoardIdentity]) -> list[str]:
    gpus = ",".join(str(board.index) for board in boards)
    return [config.dcgmi, "diag", "-r", str(level), "-i", gpus, "-j"]


def run_diagnostic(
    config: DcgmConfig,
    level: int,
    boards: Sequence[BoardIdentity],
    wall: Callable[[], float] = time.time,
) -> DcgmRun:
    """Run DCGM's diagnostic at `level` on `boards` and judge it."""
    argv = command(config, level, boards)
    started, clock = wall(), time.monotonic()

    def cannot_run(reason: str, finished: Finished | None = None) -> DcgmRun:
        return _cannot_run(level, argv, boards, started, time.monotonic() - clock, reason, finished)

    try:
        finished = run_bounded(argv, config.timeout(level))
    except FileNotFoundError:
        why = f"{config.dcgmi} is not installed (not found): install DCGM"
        return replace(cannot_run(why), started=False)
    except OSError as error:
        return replace(cannot_run(f"cannot run {config.dcgmi}: {error}"), started=False)
    except TimedOut as error:
        return cannot_run(f"dcgmi diag -r {level} {error}")
    duration = time.monotonic() - clock
    try:
        document = parse_output(finished.stdout)
    except OutputError as error:
        said = _tail(finished.stderr.strip() or finished.stdout.strip())
        why = f"dcgmi exited {finished.returncode} without a diagnostic ({error})"
        return cannot_run(f"{why}: {said or 'it said nothing'}; {HOST_ENGINE_HINT}", finished)
    runtime_error = document["DCGM Diagnostic"].get("runtime_error")
    if isinstance(runtime_error, str) and runtime_error:
        return cannot_run(f"DCGM could not run the diagnostic: {runtime_error}", finished)
    results = results_of(document)
    if not results:
        return cannot_run("DCGM ran no test", finished)
    placement = _gpu_boards(document, results, boards)
    placed = _placed(results, placement)
    return DcgmRun(
        time=started,
        level=level,
        command=tuple(argv),
        outcome="fail" if any(r.failed for r in placed) else "pass",
        duration_seconds=duration,
        boards=_board_outcomes(boards, placed, placement),
        exit_status=finished.returncode,
        dcgm_version=version(document),
        results=placed,
        output=json.dumps(document, separators=(",", ":"), sort_keys=True),
        errors=_tail(finished.stderr) or None,
    )


def _cannot_run(
    level: int,
    argv: Sequence[str],
    boards: Sequence[BoardIdentity],
    started: float,
    duration: float,
    reason: str,
    finished: Finished | None,
) -> DcgmRun:
    return DcgmRun(
        time=started,
        level=level,
        command=tuple(argv),
        outcome="cannot_run",
        duration_seconds=duration,
        boards=tuple(DcgmBoard(b.uuid, b.index, b.serial, "cannot_run") for b in boards),
        reason=reason,
        exit_status=finished.returncode if finished is not None else None,
        output=_tail(finished.stdout) or None if finished is not None else None,
        errors=_tail(finished.stderr) or None if finished is not None else None,
    )


def _tail(text: str) -> str:
    return text[-MAX_TEXT_CHARS:]


# -- judging -------------------------------------------------------------------


Placement = dict[int, tuple[BoardIdentity, Literal["serial", "index"]]]


def _gpu_boards(
    document: Mapping[str, Any], results: Sequence[DcgmResult], boards: Sequence[BoardIdentity]
) -> Placement:
    """DCGM's GPU id -> the board it is, and how that is known: by the
    serial DCGM lists for it; where it lists none, by the NVML index (the id
    DCGM gave it). A serial no board of the node has places it nowhere."""
    serials = gpu_entities(document)
    by_serial = {board.serial: board for board in boards if board.serial}
    by_index = {board.index: board for board in boards}
    gpus = set(serials) | {r.gpu_id for r in results if r.gpu_id is not None}
    placed: Placement = {}
    for gpu in sorted(gpus):
        serial = serials.get(gpu)
        if serial:
            if serial in by_serial:
                placed[gpu] = (by_serial[serial], "serial")
        elif gpu in by_index:
            placed[gpu] = (by_index[gpu], "index")
    return placed


def _placed(results: Sequence[DcgmResult], placement: Placement) -> tuple[DcgmResult, ...]:
    """The results, each on a GPU the node has given its board's UUID."""
    return tuple(
        replace(result, uuid=placement[result.gpu_id][0].uuid)
        if result.gpu_id in placement
        else result
        for result in results
    )


def _board_outcomes(
    boards: Sequence[BoardIdentity], results: Sequence[DcgmResult], placement: Placement
) -> tuple[DcgmBoard, ...]:
    """Each board: failed where a result on it failed, passed where DCGM
    has results on it and none failed, not run where it has none."""
    ids = {board.uuid: (gpu, how) for gpu, (board, how) in placement.items()}
    outcomes = []
    for board in boards:
        mine = [r for r in results if r.uuid == board.uuid]
        outcome: Outcome = (
            "fail" if any(r.failed for r in mine) else "pass" if mine else "cannot_run"
        )
        gpu, how = ids.get(board.uuid, (None, None))
        outcomes.append(DcgmBoard(board.uuid, board.index, board.serial, outcome, gpu, how))
    return tuple(outcomes)


# -- the record ----------------------------------------------------------------


def record_run(store: Store, run: DcgmRun) -> int:
    """Keep the run in the state database, by board; its id there."""
    boards = {board.uuid: board.outcome for board in run.boards}
    return store.dcgm.add(run.time, run.level, run.outcome, boards, to_wire(run))


def run_of(document: object) -> DcgmRun:
    """A run from its JSON (an API request's body, a record); WireError
    (a ValueError) naming what does not fit."""
    return from_wire(DcgmRun, document)
