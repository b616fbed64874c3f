"""What the daemon, or its state database when it is down, holds about the
subject of a report: which subject and board it is, its status, the journal
and the board's records (evidence.py)."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuwatchd.actions.client import DaemonClient, Offline
from gpuwatchd.evidence import board_evidence
from gpuwatchd.model import Finding, Severity
from gpuwatchd.policy import NODE, PolicyState, gpu_of, validate_subject
from gpuwatchd.server import EVIDENCE, MAX_JOURNAL_ENTRIES
from gpuwatchd.store import JournalEntry

_GPU_SUBJECT = re.compile(r"^gpu:(.+)$")

JsonDict = dict[str, Any]
Source = Literal["daemon", "state database"]


class SubjectError(ValueError):
    """A subject the node does not know."""


@dataclass(frozen=True)
class Subject:
    """What the report is about: the subject as named now (`gpu:2`, or
    `gpu:<UUID>` for a board gone), its board and where NVML has it."""

    name: str
    uuid: str | None = None
    index: int | None = None


@dataclass(frozen=True)
class Held:
    """What the daemon, or its state database, holds about the subject."""

    subject: Subject
    source: Source
    status: JsonDict
    journal: tuple[JournalEntry, ...]
    journal_truncated: bool
    evidence: JsonDict


# -- the subject -----------------------------------------------------------------


def _uuid_text(text: str) -> str:
    """A UUID as NVML writes it (GPU-<lowercase hex>), from what was typed."""
    text = text.strip().lower()
    return "GPU-" + text.removeprefix("gpu-")


def resolve(text: str, boards: Mapping[int, str], known: Callable[[str], str | None]) -> Subject:
    """The subject `text` names, by the boards at each index now and
    `known(uuid)`: the UUID as recorded when the state database has records
    of a board no longer on the node (None when it has none)."""
    text = text.strip()
    match = _GPU_SUBJECT.match(text)
    if match is not None and not match.group(1).isdigit():
        wanted = _uuid_text(match.group(1))
        for index, uuid in boards.items():
            if uuid.lower() == wanted.lower():
                return Subject(f"gpu:{index}", uuid, index)
        recorded = known(wanted)
        if recorded is None:
            raise SubjectError(f"no board with UUID {match.group(1)} is known to this node")
        return Subject(f"gpu:{recorded}", recorded)
    name = validate_subject(text)
    at = gpu_of(name)
    if at is None:
        return Subject(name)
    if at not in boards:
        raise SubjectError(
            f"there is no GPU {at} on this node now; name a board that is gone by its "
            "UUID (gpu:<UUID>)"
        )
    return Subject(name, boards[at], at)


# -- what the daemon holds ---------------------------------------------------------


def from_daemon(client: DaemonClient, text: str) -> Held:
    """The subject's records through the running daemon's API."""
    status = client.get("/api/v1/status")
    boards = {gpu["index"]: gpu["uuid"] for gpu in status["gpus"] if gpu.get("uuid")}

    def known(uuid: str) -> str | None:
        return _recorded(client.get(_evidence_path(uuid)), status["quarantines"], uuid)

    subject = resolve(text, boards, known)
    document = client.get(f"/api/v1/journal?since=0&limit={MAX_JOURNAL_ENTRIES}")
    entries = tuple(JournalEntry(**entry) for entry in document["entries"])
    return Held(
        subject=subject,
        source="daemon",
        status=_daemon_status(status, subject),
        journal=entries,
        journal_truncated=bool(document.get("truncated")),
        evidence=client.get(_evidence_path(subject.uuid or NODE)),
    )


def _evidence_path(board: str) -> str:
    return f"{EVIDENCE}/{urllib.parse.quote(board, safe='')}"


def from_database(offline: Offline, text: str) -> Held:
    """The subject's records in the state database of a daemon that is down."""
    store = offline.store
    boards = {board.index: board.uuid for board in store.samples.boards()}
    state = store.load_state()

    def known(uuid: str) -> str | None:
        quarantines = [dataclasses.asdict(q) for q in state.quarantines]
        return _recorded(board_evidence(store, uuid), quarantines, uuid)

    subject = resolve(text, boards, known)
    entries = store.journal.entries(limit=MAX_JOURNAL_ENTRIES + 1)
    return Held(
        subject=subject,
        source="state database",
        status=_saved_status(state, store.last_poll(), subject, entries),
        journal=entries[-MAX_JOURNAL_ENTRIES:],
        journal_truncated=len(entries) > MAX_JOURNAL_ENTRIES,
        evidence=board_evidence(store, subject.uuid or NODE),
    )


def _recorded(
    evidence: Mapping[str, Any], quarantines: Sequence[Mapping[str, Any]], uuid: str
) -> str | None:
    """`uuid` when some record names that board: a saved sample, a canary
    or DCGM record, a quarantine."""
    held = any((q.get("uuid") or "").lower() == uuid.lower() for q in quarantines)
    if held or evidence["last_seen"] or evidence["canary_mismatches"] or evidence["dcgm_runs"]:
        return uuid
    return None


def concerns(name: str, subject: Subject) -> bool:
    """Whether a subject's state belongs in the report: the subject, and
    for a GPU its NVLinks."""
    if name == subject.name:
        return True
    board = subject.index if subject.index is not None else subject.uuid
    return board is not None and name.startswith(f"nvlink:{board}/")


def _held_by(quarantine: Mapping[str, Any], subject: Subject) -> bool:
    uuid = quarantine.get("uuid")
    if subject.uuid is not None and isinstance(uuid, str):
        return uuid.lower() == subject.uuid.lower()
    return concerns(str(quarantine.get("subject")), subject)


def _daemon_status(status: Mapping[str, Any], subject: Subject) -> JsonDict:
    return {
        "from": "daemon",
        "time": status["time"],
        "node_health": status["node"]["health"],
        "driver_version": status.get("driver_version"),
        "subjects": [s for s in status["subjects"] if concerns(s["subject"], subject)],
        "quarantines": [q for q in status["quarantines"] if _held_by(q, subject)],
        "gpu": next((g for g in status["gpus"] if g.get("uuid") == subject.uuid), None),
    }


def _saved_status(
    state: PolicyState, last_poll: float | None, subject: Subject, entries: Sequence[JournalEntry]
) -> JsonDict:
    node = state.subject(NODE)
    subjects = [
        {
            "subject": tracked.subject,
            "state": tracked.health.label,
            "since": tracked.since,
            "findings": [
                _journaled_finding(tracked.subject, check, code, severity, entries)
                for check, code, severity in tracked.findings
            ],
        }
        for tracked in state.subjects
        if concerns(tracked.subject, subject)
    ]
    return {
        "from": "state database",
        "time": last_poll,
        "node_health": node.health.label if node is not None else None,
        "subjects": subjects,
        "quarantines": [
            dataclasses.asdict(q)
            for q in state.quarantines
            if _held_by(dataclasses.asdict(q), subject)
        ],
    }


def _journaled_finding(
    subject: str, check: str, code: str, severity: Severity, entries: Sequence[JournalEntry]
) -> JsonDict:
    """A finding the state database holds as active, with every field a
    Finding has, as the journal last recorded it raised (a field it did not
    record: absent, None)."""
    raised = next(
        (
            entry
            for entry in reversed(entries)
            if entry.kind == "finding_raised"
            and (entry.subject, entry.check, entry.code) == (subject, check, code)
        ),
        None,
    )
    said: JsonDict = {
        **(raised.data or {} if raised is not None else {}),
        "subject": subject,
        "check": check,
        "code": code,
        "severity": severity.label,
        "message": raised.message if raised is not None else "(no longer in the journal)",
    }
    return {field.name: said.get(field.name) for field in dataclasses.fields(Finding)}
