"""The members of a report made of what is held about its subject: the
journal's entries that are the subject's, the canary evidence, the DCGM runs
with their findings, the board's identity."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuwatchd.dcgm import findings as dcgm_findings
from gpuwatchd.dcgm import run_of
from gpuwatchd.evidence import BoardIdentity
from gpuwatchd.report.held import Held, JsonDict, Subject, concerns
from gpuwatchd.status import finding_json
from gpuwatchd.store import JournalEntry

CANARY_CHECK = "sdc"


def _named_board(entry: JournalEntry) -> str | None:
    data = entry.data or {}
    evidence = data.get("evidence")
    uuid = data.get("uuid") or (evidence.get("uuid") if isinstance(evidence, Mapping) else None)
    return uuid.lower() if isinstance(uuid, str) else None


def _matched(entry: JournalEntry, subject: Subject) -> str | None:
    """How an entry is the subject's: by the board's UUID it holds, by its
    subject, or (an entry that holds no UUID) by the index the board has now."""
    if subject.uuid is None:
        return "subject" if entry.subject == subject.name else None
    named = _named_board(entry)
    if named is not None:
        return "uuid" if named == subject.uuid.lower() else None
    if concerns(entry.subject, Subject(f"gpu:{subject.uuid}", subject.uuid)):
        return "subject"
    if subject.index is not None and concerns(entry.subject, subject):
        return "index"
    return None


def journal_of(held: Held) -> list[JsonDict]:
    return [
        {**dataclasses.asdict(entry), "matched_by": how}
        for entry in held.journal
        if (how := _matched(entry, held.subject)) is not None
    ]


# -- the canary evidence ---------------------------------------------------------------


def canary_of(journal: Sequence[Mapping[str, Any]], evidence: Mapping[str, Any]) -> JsonDict:
    """The canaries' findings on the subject, each with its evidence, and
    the board's mismatch records."""
    verdicts = [
        entry
        for entry in journal
        if entry["kind"] == "finding_raised" and entry["check"] == CANARY_CHECK
    ]
    return {
        "verdicts": verdicts,
        "mismatches": list(evidence["canary_mismatches"]),
    }


def dcgm_of(evidence: Mapping[str, Any]) -> list[JsonDict]:
    """Each DCGM run recorded for the board, with the findings it makes."""
    runs = []
    for document in evidence["dcgm_runs"]:
        recorded = {key: value for key, value in document.items() if key != "id"}
        try:
            found = [finding_json(f) for f in dcgm_findings(run_of(recorded))]
        except ValueError as error:  # a record this gpuwatchd cannot read
            found = [{"unreadable": str(error)}]
        runs.append({**document, "findings": found})
    return runs


# -- identity ----------------------------------------------------------------------------


def identity_of(
    subject: Subject, boards: Iterable[BoardIdentity], evidence: Mapping[str, Any]
) -> JsonDict | None:
    """The board as NVML names it now, else as its last saved sample did."""
    if subject.uuid is None:
        return None
    now = next((b for b in boards if b.uuid.lower() == subject.uuid.lower()), None)
    if now is not None:
        return {"from": "nvml", **dataclasses.asdict(now)}
    last = evidence["last_seen"]
    if last is None:
        return {
            "from": None,
            "uuid": subject.uuid,
            "why": "NVML does not show it and no sample of it is saved",
        }
    return {"from": "last saved sample", **last}
