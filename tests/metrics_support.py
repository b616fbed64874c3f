"""Test support for metric output: render families as /metrics does, and run
the real `promtool check metrics` over text."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class _Families(Collector):
    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        # As the daemon's exporter does: a family without samples is not shown.
        return (family for family in self._families() if family.samples)


def render(families: Callable[[], Iterable[Metric]]) -> str:
    """The exposition text of the families `families()` returns."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


def promtool_check(text: str) -> tuple[int, str]:
    """`promtool check metrics` over `text`: its exit status and what it printed."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is needed: ./scripts/test installs it"
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return checked.returncode, checked.stdout + checked.stderr
