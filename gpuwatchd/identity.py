"""A GPU is its board: what outlives a poll follows the UUID, not the index.

NVML's enumeration order "has no guarantees of consistency between reboots"
(nvml.h, nvmlDeviceGetHandleByIndex_v2): a GPU that does not come back after
a reboot renumbers the ones after it. Within one run subjects are named by
the index NVML gives now (`gpu:3`, `nvlink:3/7`), which is how people read
and type them; every quarantine and subject state carries the UUID of its
board, and when the boards NVML enumerates are known (the first poll of a
run, or NVML enumerating anew) each record moves to the subject its board has
now. A board no longer on the node keeps its quarantine under `gpu:<UUID>`
(`nvlink:<UUID>/<link>`), never another board's index, and the node says so
(`quarantined_gpu_absent`) until an operator releases it. A record that has
no UUID yet (made this run, before the first poll, or policy's new ones) is
given the board at its index.

Reads GPU samples and policy's state; pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from types import MappingProxyType

from gpuwatchd.model import Board, Decision, Finding, GpuSample, Quarantine, Severity
from gpuwatchd.policy import NODE, PolicyResult, PolicyState, SubjectState, absent, on_board

CHECK = "quarantine"
ABSENT_CODE = "quarantined_gpu_absent"

_SUBJECT = re.compile(r"^(gpu|nvlink):([^/]+)(/\d+)?$")


@dataclass(frozen=True)
class Roster:
    """The boards NVML enumerates now, by index and by UUID, and the indices
    of GPUs whose UUID it could not read yet (they answered nothing)."""

    boards: tuple[Board, ...] = ()
    unidentified: frozenset[int] = frozenset()

    @classmethod
    def of(cls, gpus: Iterable[GpuSample]) -> Roster:
        ordered = sorted(gpus, key=lambda gpu: gpu.index)
        return cls(
            tuple(Board(gpu.uuid, gpu.index, gpu.pci_bus_id) for gpu in ordered if gpu.uuid),
            frozenset(gpu.index for gpu in ordered if not gpu.uuid),
        )

    @cached_property
    def _by_index(self) -> Mapping[int, Board]:
        return MappingProxyType({board.index: board for board in self.boards})

    @cached_property
    def _by_uuid(self) -> Mapping[str, Board]:
        return MappingProxyType({board.uuid: board for board in self.boards})

    def find(self, uuid: str) -> Board | None:
        return self._by_uuid.get(uuid)

    def board_of(self, subject: str) -> Board | None:
        """The board a `gpu:<index>` or `nvlink:<index>/<link>` subject is on now."""
        match = _SUBJECT.match(subject)
        if match is None or not match.group(2).isdigit():
            return None
        return self._by_index.get(int(match.group(2)))


def moved(subject: str, where: str) -> str:
    """`subject` (a GPU's or an NVLink's) on the GPU named `where`: an index,
    or the UUID of a board that is gone."""
    match = _SUBJECT.match(subject)
    assert match is not None, subject
    return f"{match.group(1)}:{where}{match.group(3) or ''}"


def _place(subject: str, uuid: str | None, roster: Roster) -> tuple[str, Board | None]:
    """Where a record of `subject` for board `uuid` belongs now, and its board
    (None: not a GPU's record, or no board is known for it)."""
    if _SUBJECT.match(subject) is None:
        return subject, None
    if uuid is None:
        return subject, roster.board_of(subject)
    board = roster.find(uuid)
    if board is None and roster.unidentified:
        # It may be the GPU that has not said who it is yet: decided once it does.
        return subject, None
    if board is None:
        return moved(subject, uuid), None
    return moved(subject, str(board.index)), board


def reconcile(state: PolicyState, roster: Roster) -> PolicyState:
    """`state` with every GPU record on its board's subject now (see the
    module's docstring). Of two records for one subject, the one whose board
    is known stands."""
    if not roster.boards:
        return state
    quarantines: dict[str, Quarantine] = {}
    for held in sorted(state.quarantines, key=lambda q: q.uuid is None):
        subject, board = _place(held.subject, held.uuid, roster)
        if subject not in quarantines:
            fields = on_board(board) if board is not None else {}
            quarantines[subject] = replace(held, subject=subject, **fields)
    subjects: dict[str, SubjectState] = {}
    for tracked in sorted(state.subjects, key=lambda s: s.uuid is None):
        subject, board = _place(tracked.subject, tracked.uuid, roster)
        # A board that is gone keeps the state of its quarantine, nothing else.
        if subject in subjects or (absent(subject) and subject not in quarantines):
            continue
        uuid = board.uuid if board is not None else tracked.uuid
        subjects[subject] = replace(tracked, subject=subject, uuid=uuid)
    if quarantines == {q.subject: q for q in state.quarantines} and subjects == {
        s.subject: s for s in state.subjects
    }:
        return state
    return replace(
        state,
        quarantines=tuple(quarantines[name] for name in sorted(quarantines)),
        subjects=tuple(subjects[name] for name in sorted(subjects)),
    )


def stamp(result: PolicyResult, roster: Roster) -> PolicyResult:
    """`result` with the board of each decision, quarantine and subject state
    that policy made without one (policy names subjects by index only). The
    records that have a board are left as they are: `reconcile` moves them
    when the roster changes."""

    def decided(decision: Decision) -> Decision:
        board = roster.board_of(decision.subject) if decision.uuid is None else None
        return decision if board is None else replace(decision, uuid=board.uuid)

    def held(quarantine: Quarantine) -> Quarantine:
        board = roster.board_of(quarantine.subject) if quarantine.uuid is None else None
        return quarantine if board is None else replace(quarantine, **on_board(board))

    def tracked(state: SubjectState) -> SubjectState:
        board = roster.board_of(state.subject) if state.uuid is None else None
        return state if board is None else replace(state, uuid=board.uuid)

    state = result.state
    stamped = replace(
        state,
        quarantines=tuple(held(q) for q in state.quarantines),
        subjects=tuple(tracked(s) for s in state.subjects),
    )
    decisions = tuple(decided(d) for d in result.decisions)
    if stamped == state and decisions == result.decisions:
        return result
    return replace(result, state=stamped, decisions=decisions)


def placed(sample: GpuSample, roster: Roster) -> GpuSample | None:
    """A sample of an earlier run at the index its board has now; None when
    its board is not (or not yet known to be) on the node."""
    board = roster.find(sample.uuid) if sample.uuid else None
    if board is None:
        return None
    if board.index == sample.index:
        return sample
    links = tuple(replace(link, gpu=board.index) for link in sample.nvlinks)
    return replace(sample, index=board.index, nvlinks=links)


def absent_finding(quarantines: Sequence[Quarantine]) -> Finding | None:
    """The node's finding for the quarantined boards that are not on it."""
    gone = [q for q in quarantines if absent(q.subject) and not q.dry_run]
    if not gone:
        return None
    named = "; ".join(
        f"{q.uuid} (last gpu:{q.last_index}, bus {q.pci_bus_id or 'unknown'}, "
        f"quarantined for {q.reason})"
        for q in gone
    )
    return Finding(
        subject=NODE,
        check=CHECK,
        code=ABSENT_CODE,
        severity=Severity.WARN,
        message=(
            f"quarantined GPU(s) not on this node: {named}. The quarantine stays with the "
            "board; release it (gpuwatchd quarantine release gpu:<UUID>) once the board was "
            "removed on purpose, reseat or replace it otherwise"
        ),
        evidence={
            "uuids": ",".join(str(q.uuid) for q in gone),
            "last_indices": ",".join(str(q.last_index) for q in gone),
            "pci_bus_ids": ",".join(q.pci_bus_id or "unknown" for q in gone),
        },
    )
