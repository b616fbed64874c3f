"""docs/decisions.md lists every decision that needs no confirming, and the
code makes no other: the set is derived from the code (every `Finding` whose
`definitive` or `immediate` can be true, and the XID catalog's rows), so a new
definitive path fails here until it is written down."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from gpuwatchd.checks.xid_catalog import CATALOG

REPO = Path(__file__).parent.parent
CENSUS = REPO / "docs" / "decisions.md"
SOURCES = REPO / "gpuwatchd"
DECISIONS = ("definitive", "immediate")
# The one site whose code is not a literal: the XID check names its finding
# after the XID's kind (`xid_<kind>`), and the catalog says which XIDs decide.
XID_FINDING = Path("checks") / "xid.py"

Path_ = tuple[str, str, str]  # (decision, check, code)


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's top-level `NAME = "text"` assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _texts(node: ast.expr, constants: dict[str, str]) -> set[str] | None:
    """The strings an expression can be: a literal, a module constant, or
    either branch of a conditional; None when it is anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name) and node.id in constants:
        return {constants[node.id]}
    if isinstance(node, ast.IfExp):
        body, orelse = _texts(node.body, constants), _texts(node.orelse, constants)
        return None if body is None or orelse is None else body | orelse
    return None


def _can_be_true(node: ast.expr) -> bool:
    return not (isinstance(node, ast.Constant) and node.value is False)


def _finding_sites() -> Iterator[tuple[Path, ast.Call, dict[str, str]]]:
    for path in sorted(SOURCES.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = _constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                yield path.relative_to(SOURCES), node, constants


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
    for where, call, constants in _finding_sites():
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        decisions = [d for d in DECISIONS if d in keywords and _can_be_true(keywords[d])]
        if not decisions:
            continue
        if where == XID_FINDING:
            paths |= _xid_paths()
            continue
        checks = _texts(keywords["check"], constants)
        codes = _texts(keywords["code"], constants)
        assert checks is not None and codes is not None, (
            f"gpuwatchd/{where}:{call.lineno}: a Finding that can be {' or '.join(decisions)} "
            "names its check or code by an expression this census cannot read: use literals"
        )
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
