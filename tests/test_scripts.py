"""What the operator-facing scripts say when something is missing, and what
their help says: scripts/demo-stack, scripts/fleet-stack, bench/sdc_recall.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import demo_stack  # noqa: E402  (a script, found through the path above)


@pytest.mark.parametrize(
    ("names", "package"),
    [
        (("prometheus-alertmanager", "alertmanager"), None),
        (("vmalert",), "victoria-metrics"),
    ],
)
def test_a_stack_binary_missing_from_path_names_the_debian_package_to_install(
    names: tuple[str, ...],
    package: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        demo_stack.binary(*names, package=package)
    message = str(exit_.value.code)
    assert f"none of {', '.join(names)} is on PATH" in message
    assert f"apt-get install {package or names[0]}" in message


def test_a_stack_binary_on_path_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = tmp_path / "alertmanager"
    found.write_text("#!/bin/sh\n")
    found.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert demo_stack.binary("prometheus-alertmanager", "alertmanager") == str(found)
