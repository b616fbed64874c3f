"""What a DCGM run says, as findings and as lines for a person.

A board with a failed test gets `dcgm_diag_failed` (critical, inspect the
hardware; not definitive: nothing quarantines on it, the operator decides);
failures that name no board of the node are one such finding on the node;
a run that could not run is `dcgm_diag_not_run` on the node.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatchd.dcgm.output import DcgmResult
from gpuwatchd.dcgm.run import DcgmBoard, DcgmRun
from gpuwatchd.model import Action, Finding, Severity
from gpuwatchd.policy import NODE

CHECK = "dcgm"
FAILED_CODE = "dcgm_diag_failed"
NOT_RUN_CODE = "dcgm_diag_not_run"


def findings(run: DcgmRun) -> tuple[Finding, ...]:
    """What the run says: a finding on each board with a failed test, one on
    the node for failures that name no board of the node, or the one that
    says it could not run."""
    if run.outcome == "cannot_run":
        return (_not_run(run),)
    failed = [result for result in run.results if result.failed]
    on_boards = [
        _failed_on_board(run, board, [r for r in failed if r.uuid == board.uuid])
        for board in run.boards
        if board.outcome == "fail"
    ]
    # A failed summary of a test that failed on a board says nothing more.
    pinned = {(r.category, r.test) for r in failed if r.uuid is not None}
    elsewhere = [
        r
        for r in failed
        if r.uuid is None and (r.gpu_id is not None or (r.category, r.test) not in pinned)
    ]
    return tuple(on_boards) + ((_failed_on_node(run, elsewhere),) if elsewhere else ())


def _said(results: Sequence[DcgmResult]) -> str:
    parts = []
    for result in results:
        warnings = "; ".join(w.warning for w in result.warnings) or "no warning given"
        parts.append(f"{result.test} ({result.category}): {warnings}")
    return " | ".join(parts)


def _evidence(run: DcgmRun, results: Sequence[DcgmResult]) -> dict[str, float | int | str]:
    evidence: dict[str, float | int | str] = {
        "level": run.level,
        "tests": ",".join(sorted({r.test for r in results})),
        "run_time": run.time,
    }
    error_ids = sorted({w.error_id for r in results for w in r.warnings if w.error_id is not None})
    if error_ids:
        evidence["dcgm_error_ids"] = ",".join(map(str, error_ids))
    if run.dcgm_version:
        evidence["dcgm_version"] = run.dcgm_version
    return evidence


def _failed_on_board(run: DcgmRun, board: DcgmBoard, results: Sequence[DcgmResult]) -> Finding:
    evidence = {**_evidence(run, results), "uuid": board.uuid}
    if board.serial:
        evidence["serial"] = board.serial
    if board.dcgm_gpu_id is not None:
        evidence["dcgm_gpu_id"] = board.dcgm_gpu_id
    if board.matched_by:
        evidence["matched_by"] = board.matched_by
    return Finding(
        subject=f"gpu:{board.index}",
        check=CHECK,
        code=FAILED_CODE,
        severity=Severity.CRITICAL,
        message=f"DCGM diagnostic level {run.level} failed on gpu:{board.index} "
        f"({board.uuid}): {_said(results)}",
        action=Action.INSPECT_HARDWARE,
        evidence=evidence,
    )


def _failed_on_node(run: DcgmRun, results: Sequence[DcgmResult]) -> Finding:
    unknown = sorted({r.gpu_id for r in results if r.gpu_id is not None})
    where = (
        f" on DCGM GPU id(s) {', '.join(map(str, unknown))}, which are no board of this node's NVML"
        if unknown
        else ", naming no GPU"
    )
    return Finding(
        subject=NODE,
        check=CHECK,
        code=FAILED_CODE,
        severity=Severity.CRITICAL,
        message=f"DCGM diagnostic level {run.level} failed{where}: {_said(results)}",
        action=Action.INSPECT_HARDWARE,
        evidence=_evidence(run, results),
    )


def _not_run(run: DcgmRun) -> Finding:
    return Finding(
        subject=NODE,
        check=CHECK,
        code=NOT_RUN_CODE,
        severity=Severity.WARN,
        message=f"DCGM diagnostic level {run.level} could not run: {run.reason}",
        evidence={"level": run.level, "run_time": run.time},
    )


def describe(run: DcgmRun) -> list[str]:
    """Lines for a person: every result that did not pass, then the verdict."""
    lines = []
    for result in run.results:
        if result.status == "Pass":
            continue
        board = run.board(result.uuid)
        where = (
            f"gpu {board.index}"
            if board
            else (f"dcgm gpu {result.gpu_id}" if result.gpu_id is not None else "summary")
        )
        warnings = "; ".join(w.warning for w in result.warnings)
        lines.append(f"{where:>12}  {result.test:<28} {result.status:<8} {warnings}".rstrip())
    if run.outcome == "cannot_run":
        lines.append(f"DCGM diagnostic level {run.level} could not run: {run.reason}")
    else:
        failed = [f"gpu:{b.index}" for b in run.boards if b.outcome == "fail"]
        verdict = f"failed on {', '.join(failed)}" if failed else "passed"
        if run.outcome == "fail" and not failed:
            verdict = "failed (on no GPU of this node)"
        lines.append(
            f"DCGM diagnostic level {run.level} {verdict} "
            f"({len(run.boards)} GPU(s), {run.duration_seconds:.0f}s)"
        )
    return lines
