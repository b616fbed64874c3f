"""`dcgmi diag -j`'s JSON, read in the shape DCGM publishes (NVIDIA/DCGM,
testing/python3/dcgm_diag_schema.json; a copy is in tests/fixtures/dcgm).

DCGM writes results with no entity (a global one) though the schema
requires one (dcgmi/Diag.cpp, HelperJsonAddResult): those are read as a
test's summary is. Anything else that is not as the schema has it is an
OutputError naming where.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# DCGM's status of a failed test (testing/python3/DcgmiDiag.py: TEST_STATUS_FAIL).
FAIL = "Fail"


class OutputError(ValueError):
    """dcgmi's output is not the diagnostic's JSON as DCGM's schema has it."""


@dataclass(frozen=True)
class DcgmWarning:
    """One of a result's `warnings`: DCGM's text and its error codes."""

    warning: str
    error_id: int | None = None
    error_category: int | None = None
    error_severity: int | None = None


@dataclass(frozen=True)
class DcgmResult:
    """A test's result on one entity, or its summary (no entity)."""

    category: str
    test: str
    status: str
    entity_group: str | None = None
    entity_id: int | None = None
    warnings: tuple[DcgmWarning, ...] = ()
    info: tuple[str, ...] = ()
    # The board, for a GPU entity the node has.
    uuid: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    @property
    def gpu_id(self) -> int | None:
        """DCGM's id of the GPU this result is on; None for any other entity."""
        group = (self.entity_group or "").lower()
        return self.entity_id if group == "gpu" else None


def parse_output(text: str) -> dict[str, Any]:
    """The diagnostic's JSON document in dcgmi's output (which may print a
    line before it), checked for what this module reads."""
    start = text.find("{")
    if start < 0:
        raise OutputError("no JSON object in its output")
    try:
        document, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError as error:
        raise OutputError(f"its output is not JSON: {error}") from error
    document = _object(document, "the output")
    _object(document.get("DCGM Diagnostic"), "DCGM Diagnostic")
    results_of(document)
    gpu_entities(document)
    return document


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OutputError(f"{where} is not an object")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise OutputError(f"{where} is not a list")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise OutputError(f"{where} is not text")
    return value


def _integer(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise OutputError(f"{where} is not a whole number")
    return value


def _optional_integer(value: object, where: str) -> int | None:
    return None if value is None else _integer(value, where)


def results_of(document: Mapping[str, Any]) -> tuple[DcgmResult, ...]:
    """Every test's results and summary, in the order DCGM wrote them."""
    diagnostic = _object(document.get("DCGM Diagnostic"), "DCGM Diagnostic")
    categories = _list(diagnostic.get("test_categories", []), "test_categories")
    return tuple(
        result
        for position, category in enumerate(categories)
        for result in _category(category, f"test_categories[{position}]")
    )


def _category(value: object, where: str) -> Iterator[DcgmResult]:
    category = _object(value, where)
    name = _text(category.get("category"), f"{where}.category")
    for position, test in enumerate(_list(category.get("tests"), f"{where}.tests")):
        yield from _test(name, test, f"{where}.tests[{position}]")


def _test(category: str, value: object, where: str) -> Iterator[DcgmResult]:
    test = _object(value, where)
    name = _text(test.get("name"), f"{where}.name")
    for position, result in enumerate(_list(test.get("results"), f"{where}.results")):
        yield _result(category, name, result, f"{where}.results[{position}]")
    yield _result(category, name, test.get("test_summary"), f"{where}.test_summary", summary=True)


def _result(
    category: str, test: str, value: object, where: str, summary: bool = False
) -> DcgmResult:
    result = _object(value, where)
    group = None if summary else result.get("entity_group")
    return DcgmResult(
        category=category,
        test=test,
        status=_text(result.get("status"), f"{where}.status"),
        entity_group=None if group is None else _text(group, f"{where}.entity_group"),
        entity_id=None if summary else _optional_integer(result.get("entity_id"), where),
        warnings=tuple(
            _warning(item, f"{where}.warnings[{position}]")
            for position, item in enumerate(_list(result.get("warnings", []), f"{where}.warnings"))
        ),
        info=tuple(
            _text(item, f"{where}.info") for item in _list(result.get("info", []), f"{where}.info")
        ),
    )


def _warning(value: object, where: str) -> DcgmWarning:
    warning = _object(value, where)
    return DcgmWarning(
        warning=_text(warning.get("warning"), f"{where}.warning"),
        error_id=_optional_integer(warning.get("error_id"), f"{where}.error_id"),
        error_category=_optional_integer(warning.get("error_category"), f"{where}.error_category"),
        error_severity=_optional_integer(warning.get("error_severity"), f"{where}.error_severity"),
    )


def gpu_entities(document: Mapping[str, Any]) -> dict[int, str | None]:
    """DCGM's GPU ids in the run, each with the serial number DCGM read."""
    serials: dict[int, str | None] = {}
    for position, group in enumerate(_list(document.get("entity_groups", []), "entity_groups")):
        where = f"entity_groups[{position}]"
        group = _object(group, where)
        if _text(group.get("entity_group"), f"{where}.entity_group").lower() != "gpu":
            continue
        for entity in _list(group.get("entities"), f"{where}.entities"):
            entity = _object(entity, f"{where}.entities")
            gpu = _integer(entity.get("entity_id"), f"{where}.entities.entity_id")
            serial = entity.get("serial_num")
            serials[gpu] = _text(serial, f"{where}.serial_num") if serial is not None else None
    return serials


def version(document: Mapping[str, Any]) -> str | None:
    metadata = document.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    return version if isinstance(version, str) else None
