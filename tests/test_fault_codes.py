"""The fault code catalog (gpuwatchd/faults/) and the code hold each other:
every finding code the source can make (the census of tests/census_support.py)
has exactly one fault code, every fault code in use names a finding code the
source makes, ids are unique and never change meaning (the issued ledger),
and docs/fault-codes.md is what scripts/make-fault-codes writes from them."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

from census_support import REPO, codes

from gpuwatchd.faults import BLOCKS, CATALOG, ENTRIES, ID_PATTERN, fault_code
from gpuwatchd.faults.sources import SOURCES
from gpuwatchd.model import Finding, Severity

ISSUED = REPO / "tests" / "fixtures" / "fault-codes-issued.txt"
IN_USE = [entry for entry in ENTRIES if not entry.retired]


def _issued() -> list[tuple[str, str]]:
    lines = ISSUED.read_text(encoding="utf-8").splitlines()
    return [(line.split()[0], line.split()[1]) for line in lines if not line.startswith("#")]


def test_every_finding_code_the_source_can_make_has_exactly_one_fault_code() -> None:
    made = codes()
    assert len(made) > 80  # the census reads the whole source, not a corner of it
    listed = Counter(entry.code for entry in IN_USE)
    assert {code for code in made if listed[code] != 1} == set(), (
        "give each of these one entry in gpuwatchd/faults/, then run scripts/make-fault-codes"
    )


def test_every_fault_code_in_use_names_a_finding_code_the_source_makes() -> None:
    made = codes()
    assert [e.id for e in IN_USE if e.code not in made] == [], "retire these entries instead"
    assert [e.id for e in ENTRIES if e.retired and e.code in made] == [], (
        "a retired entry's finding code is made again: give it a new id"
    )


def test_each_fault_code_names_the_check_that_makes_its_finding() -> None:
    made = codes()
    wrong = {e.id: sorted(made[e.code]) for e in IN_USE if made[e.code] != {e.check}}
    assert wrong == {}


def test_ids_and_finding_codes_are_unique_and_of_the_documented_form() -> None:
    ids = Counter(entry.id for entry in ENTRIES)
    assert [i for i, n in ids.items() if n > 1] == []
    assert [c for c, n in Counter(e.code for e in ENTRIES).items() if n > 1] == []
    assert [i for i in ids if not ID_PATTERN.fullmatch(i) or i.endswith("00")] == []
    in_use = {block.number for block in BLOCKS if not block.reserved}
    assert {entry.block for entry in ENTRIES} <= in_use, "a code outside its blocks, or reserved"
    assert len(CATALOG) == len(ENTRIES)


def test_an_issued_id_keeps_its_meaning_and_every_id_is_issued() -> None:
    issued = _issued()
    assert len(issued) == len(set(issued)) == len(dict(issued)), "an id issued twice"
    assert [(e.id, e.code) for e in ENTRIES if (e.id, e.code) not in issued] == [], (
        "append new ids to tests/fixtures/fault-codes-issued.txt; an issued id never changes"
    )
    by_id = {entry.id: entry.code for entry in ENTRIES}
    assert [pair for pair in issued if by_id.get(pair[0]) != pair[1]] == [], (
        "an issued id left the catalog or changed its meaning: keep its entry, retired"
    )


def test_the_ledger_of_issued_ids_is_append_only_in_id_order_within_a_block() -> None:
    # Ids are handed out in order: a lower id appearing after a higher one of
    # its block means an id was given out a second time.
    last: dict[str, str] = {}
    for issued_id, _ in _issued():
        block = issued_id[:5]
        assert issued_id > last.get(block, ""), f"{issued_id} is issued after {last[block]}"
        last[block] = issued_id


def test_every_document_an_entry_cites_is_in_the_sources() -> None:
    cited = {title for e in ENTRIES for title in re.findall(r"NVIDIA, \*([^*]+)\*", e.nvidia)}
    assert cited <= set(SOURCES)
    assert all(entry.meaning and entry.evidence and entry.action for entry in ENTRIES)


def test_a_finding_carries_the_fault_code_of_its_code() -> None:
    finding = Finding("gpu:0", "memory", "row_remap_failure", Severity.CRITICAL, "flag set")
    assert finding.fault_code == CATALOG["row_remap_failure"].id == "GW-1103"
    assert fault_code("not_a_code_of_this_version") is None
    assert fault_code(None) is None


def test_docs_fault_codes_is_what_the_script_writes_from_the_catalog() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make-fault-codes"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    document = (REPO / "docs" / "fault-codes.md").read_text(encoding="utf-8")
    assert all(f"### {e.id}: `{e.check}/{e.code}`" in document for e in ENTRIES)
