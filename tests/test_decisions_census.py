"""docs/decisions.md lists every decision that needs no confirming, and the
code makes no other: the set is derived from the code (every `Finding` whose
`definitive` or `immediate` can be true, and the XID catalog's rows), so a new
definitive path fails here until it is written down."""

from __future__ import annotations

import ast
import re

from census_support import REPO, XID_FINDING, sites

from gpuwatchd.checks.xid_catalog import CATALOG

CENSUS = REPO / "docs" / "decisions.md"
DECISIONS = ("definitive", "immediate")

Path_ = tuple[str, str, str]  # (decision, check, code)


def _can_be_true(node: ast.expr) -> bool:
    return not (isinstance(node, ast.Constant) and node.value is False)


def _xid_paths() -> set[Path_]:
    paths = set()
    for entry in CATALOG.values():
        code = f"xid_{entry.kind.value}"
        if entry.definitive or entry.escalates:
            paths.add(("definitive", "xid", code))
        if entry.drains:
            paths.add(("immediate", "xid", code))
    return paths


def derived() -> set[Path_]:
    paths: set[Path_] = set()
    for site in sites():
        keywords = {k.arg: k.value for k in site.call.keywords if k.arg is not None}
        decisions = [d for d in DECISIONS if d in keywords and _can_be_true(keywords[d])]
        if not decisions:
            continue
        # The XID check decides by the catalog's rows, which name its finding.
        if (site.module.path, site.function) == XID_FINDING:
            paths |= _xid_paths()
            continue
        checks, codes = site.texts("check"), site.texts("code")
        paths |= {(d, check, code) for d in decisions for check in checks for code in codes}
    return paths


def _rows() -> list[list[str]]:
    rows = []
    for line in CENSUS.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells and cells[0] in DECISIONS:
            rows.append(cells)
    return rows


def listed() -> set[Path_]:
    return {(row[0], row[1].strip("`"), row[2].strip("`")) for row in _rows()}


def test_every_decision_that_needs_no_confirming_is_in_the_census() -> None:
    assert derived() - listed() == set(), "add these to docs/decisions.md, with their evidence"


def test_the_census_lists_no_decision_the_code_does_not_make() -> None:
    assert listed() - derived() == set(), "docs/decisions.md lists paths the code no longer has"


def test_the_census_names_the_xids_the_catalog_decides_at_once() -> None:
    def numbers(decision: str) -> set[int]:
        rows = [row for row in _rows() if row[0] == decision and row[1] == "`xid`"]
        return {int(n) for row in rows for n in re.findall(r"\d+", row[4])}

    definitive = {c for c, e in CATALOG.items() if e.definitive or e.escalates}
    assert numbers("definitive") == definitive
    assert numbers("immediate") == {c for c, e in CATALOG.items() if e.drains}


def test_every_row_says_what_evidence_it_needs_and_whose_criterion_it_is() -> None:
    for row in _rows():
        assert len(row) == 7 and all(row[5:]), row
