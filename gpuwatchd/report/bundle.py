"""The archive: the members redacted (and anonymized when asked), a
manifest, one tar.gz written whole or not at all."""

from __future__ import annotations

import datetime
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatchd import __version__
from gpuwatchd import capture as captures
from gpuwatchd.clock import Clock
from gpuwatchd.config import Config
from gpuwatchd.inventory import read_inventory
from gpuwatchd.redact import MIN_SECRET_CHARS, Redactions, anonymized, pseudonyms
from gpuwatchd.report.held import Held, JsonDict
from gpuwatchd.report.members import canary_of, dcgm_of, identity_of, journal_of
from gpuwatchd.server import MAX_JOURNAL_ENTRIES

FORMAT = "gpuwatchd-report"
VERSION = 1


@dataclass(frozen=True)
class Bundle:
    folder: str
    members: tuple[tuple[str, bytes], ...]
    manifest: JsonDict


def build(
    held: Held,
    config: Config,
    clock: Clock,
    redactions: Redactions,
    anonymize: bool,
    before_poll: Callable[[float], None] | None = None,
) -> Bundle:
    """The bundle of `held`, with the node's answers captured now."""
    inventory = read_inventory(clock, config.sources.nvml)
    capture = captures.capture_node(config, clock, captures.DEFAULT_POLLS, before_poll)
    journal = journal_of(held)
    identity = identity_of(held.subject, inventory.boards, held.evidence)
    texts = _texts(
        {
            "status.json": held.status,
            "journal.json": journal,
            "identity.json": identity,
            "canary.json": canary_of(journal, held.evidence),
            "dcgm.json": dcgm_of(held.evidence),
            "capture.json": captures.anonymize(capture) if anonymize else capture,
        }
    )
    mapping: Mapping[str, str] = {}
    if anonymize:
        serials = [board.serial for board in inventory.boards if board.serial]
        if identity is not None and identity.get("serial"):
            serials.append(identity["serial"])
        mapping = pseudonyms(captures.pseudonyms(capture), texts.values(), serials)
    members, redacted = _sealed(texts, mapping, redactions)
    created = clock.now()
    manifest: JsonDict = {
        "format": FORMAT,
        "version": VERSION,
        "gpuwatchd": __version__,
        "created": created,
        "subject": held.subject.name,
        "uuid": held.subject.uuid,
        "status_from": held.source,
        "identity_from": identity.get("from") if identity is not None else None,
        "anonymized": anonymize,
        "redacted": redacted,
        "members": [
            {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in members
        ],
        "notes": _notes(held, journal, redactions, inventory.unavailable),
    }
    [sealed], _ = _sealed(_texts({"manifest.json": manifest}), mapping, redactions)
    manifest = json.loads(sealed[1])
    folder = f"gpuwatchd-report-{_slug(manifest['subject'])}-{_stamp(created)}"
    return Bundle(folder, (sealed, *members), manifest)


def _texts(parts: Mapping[str, Any]) -> dict[str, str]:
    return {
        name: json.dumps(value, indent=1, sort_keys=True) + "\n" for name, value in parts.items()
    }


def _sealed(
    texts: Mapping[str, str], mapping: Mapping[str, str], redactions: Redactions
) -> tuple[list[tuple[str, bytes]], int]:
    """The members as written: anonymized by `mapping`, then redacted; and
    how many redactions that took."""
    members, count = [], 0
    for name, text in texts.items():
        text, found = redactions.apply(anonymized(text, mapping))
        members.append((name, text.encode()))
        count += found
    return members, count


def _notes(
    held: Held,
    journal: Sequence[Mapping[str, Any]],
    redactions: Redactions,
    nvml_unavailable: str | None,
) -> list[str]:
    """What a reader of the bundle must know about what it lacks."""
    notes = []
    by_index = sum(1 for entry in journal if entry["matched_by"] == "index")
    if by_index:
        notes.append(
            f"{by_index} journal entries hold no UUID and were matched by the index the board "
            "has now: they may be another board's if the GPUs were renumbered since"
        )
    if held.journal_truncated:
        notes.append(f"the journal was read up to its newest {MAX_JOURNAL_ENTRIES} entries")
    if nvml_unavailable:
        notes.append(f"NVML gave no boards now: {nvml_unavailable}")
    if redactions.too_short:
        notes.append(
            f"{redactions.too_short} secret(s) shorter than {MIN_SECRET_CHARS} characters "
            "could not be told from other text and were not searched for"
        )
    return notes


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-")


def _stamp(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, tz=datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def summary(bundle: Bundle) -> str:
    """One line on what the bundle holds."""
    manifest = bundle.manifest
    total = sum(len(data) for _, data in bundle.members)
    return (
        f"{manifest['subject']}: {len(bundle.members)} members, {total} bytes, status from the "
        f"{manifest['status_from']}, {manifest['redacted']} redaction(s)"
        + (", anonymized" if manifest["anonymized"] else "")
    )


def default_path(bundle: Bundle) -> str:
    return f"{bundle.folder}.tar.gz"


def write(bundle: Bundle, path: str) -> None:
    """The archive at `path`, mode 0600 (it names the node's hardware),
    written whole or not at all."""
    directory = os.path.dirname(os.path.abspath(path))
    descriptor, scratch = tempfile.mkstemp(prefix=".gpuwatchd-report-", dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(archive(bundle))
        os.replace(scratch, path)
    except BaseException:
        os.unlink(scratch)
        raise


def archive(bundle: Bundle) -> bytes:
    """The tar.gz: members under the bundle's folder, owned by no one, mode
    0644, stamped with the bundle's time (gzip's header too)."""
    mtime = int(bundle.manifest["created"])
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=mtime) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, data in bundle.members:
            info = tarfile.TarInfo(f"{bundle.folder}/{name}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
