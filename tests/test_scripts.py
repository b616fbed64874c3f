"""The operator-facing scripts: what scripts/demo-stack and fleet-stack say
when a binary is missing, and what scripts/runbook-links writes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

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


def _script(name: str) -> ModuleType:
    """A script without the .py suffix, loaded by path."""
    module_name = name.replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(module_name, str(REPO / "scripts" / name))
    spec = importlib.util.spec_from_loader(module_name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


runbook_links = _script("runbook-links")
SHIPPED_RULES = sorted((REPO / "config" / "prometheus" / "rules").glob("*.yml"))


def _alerts(rule_file: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(rule_file.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _without_links(rule_file: Path) -> Any:
    document = yaml.safe_load(rule_file.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("runbook_url", None)
    return document


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://wiki.example.com/gpuwatchd/runbooks",
            "https://wiki.example.com/gpuwatchd/runbooks#{}",
        ),
        ("https://wiki.example.com/ops/{alert}?a=1#top", "https://wiki.example.com/ops/{}?a=1#top"),
    ],
)
def test_runbook_links_point_every_alert_and_the_unit_at_the_sites_runbooks(
    url: str, expected: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-I", str(REPO / "scripts" / "runbook-links"), url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    written = sorted((tmp_path / "rules").glob("*.yml"))
    assert [path.name for path in written] == [path.name for path in SHIPPED_RULES]
    for shipped, relinked in zip(SHIPPED_RULES, written, strict=True):
        alerts = _alerts(relinked)
        for alert in alerts:
            link = alert["annotations"]["runbook_url"]
            assert link == expected.format(alert["alert"].lower()), alert["alert"]
        # Nothing but the links changed.
        assert _without_links(relinked) == _without_links(shipped)
    dropin = (tmp_path / "gpuwatchd.service.d" / "runbooks.conf").read_text().splitlines()
    assert [line for line in dropin if line.startswith("Documentation=")] == [
        "Documentation=",
        f"Documentation={url.replace('{alert}', '')}",
    ]
    if shutil.which("promtool"):
        checked = subprocess.run(
            ["promtool", "check", "rules", *map(str, written)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("wiki.example.com/runbooks", "is not an http:// or https:// URL"),
        ("https://wiki.example.com/run books", "has a space"),
        ("https://wiki.example.com/runbooks#gpuwatchd", "has a #fragment"),
    ],
)
def test_runbook_links_refuse_a_url_they_cannot_link_and_write_nothing(
    url: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runbook_links.main([url, str(tmp_path / "out")]) == 1
    assert why in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_runbook_links_refuse_a_rule_file_with_a_link_they_cannot_read(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    text = SHIPPED_RULES[0].read_text()
    (rules / "odd.yml").write_text(text.replace("runbook_url: https", "runbook_url:  https", 1))
    with pytest.raises(runbook_links.Refused, match="runbook link"):
        runbook_links.write("https://wiki.example.com/r", tmp_path / "out", rules)
    assert not (tmp_path / "out").exists()


# Every script an operator runs with --help, as the docs give it.
HELPED = [
    "scripts/fleet_stack.py",
    "scripts/demo_stack.py",
    "scripts/runbook-links",
    *sorted(str(path.relative_to(REPO)) for path in (REPO / "bench").glob("*.py")),
]


def _options(help_text: str) -> dict[str, str]:
    """Each argument and option of an argparse --help, and its help text."""
    section = help_text.split("\n\n", 2)[2]
    options: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        # A name's words are one space apart; its help is two or more spaces on.
        entry = re.match(r"  (\S.*?)(?:  +(.*))?$", line)
        if entry:
            name = entry[1]
            options[name] = entry[2] or ""
        elif name is not None and line.startswith("   "):
            options[name] = f"{options[name]} {line.strip()}".strip()
    return options


@pytest.mark.parametrize("script", HELPED)
def test_every_option_of_a_script_has_help_and_its_description_ends_a_sentence(
    script: str,
) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    description = result.stdout.split("\n\n")[1]
    assert description.rstrip().endswith("."), description
    options = _options(result.stdout)
    assert len(options) > 1, result.stdout
    assert [name for name, text in options.items() if not text] == []


@pytest.mark.parametrize("script", sorted((REPO / "bench").glob("*.py")), ids=lambda p: p.name)
def test_a_bench_scripts_usage_runs_it_with_the_checkouts_virtual_environment(
    script: Path,
) -> None:
    # First-day review N16: a system python3 lacks gpuwatchd and psutil.
    usage = [line.strip() for line in script.read_text().splitlines() if "bench/" in line]
    runs = [line for line in usage if re.match(r"\S*python3? bench/", line)]
    assert runs and all(line.startswith(".venv/bin/python bench/") for line in runs), runs
