"""The layers as STYLE.md draws them: sources read, checks judge, export
renders. What the checks and the exporter share with a source (a counter's
width, a PCI address's form) lives in the model, so neither imports a source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuwatchd"


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", ["checks", "export"])
def test_checks_and_export_import_nothing_from_the_sources(layer: str) -> None:
    modules = sorted((PACKAGE / layer).glob("*.py"))
    assert modules
    reading = {
        f"{layer}/{path.name}": sorted(
            n for n in imported(path) if n.startswith("gpuwatchd.sources")
        )
        for path in modules
    }
    assert {module: names for module, names in reading.items() if names} == {}
