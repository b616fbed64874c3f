"""Real kernel-log records (tests/fixtures/kmsg/, with their sources) for the
tests: by name, as /dev/kmsg records, on a simulated GPU's bus, and as a
scenario's `kernel_line` fault."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
REAL: dict[str, Any] = yaml.safe_load((FIXTURES / "records.yaml").read_text())
# The simulator's GPU 0 and 1 (NVML bus ids 00000000:18:00.0 and 00000000:2A:00.0).
GPU0, GPU1 = "0000:18:00", "0000:2a:00"
# The GPU's PCI address in an `NVRM:` record (an SXid names its switch's).
_BUS = re.compile(
    r"(?<=Xid \(PCI:)[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}|(?<=GPU )[0-9a-f:]{10}(?=\.0)"
)


def real(name: str) -> str:
    """A fixture record's message by its key (`derived` ones by theirs)."""
    message = REAL.get(name) or REAL["derived"][name]
    assert isinstance(message, str), name
    return message


def on_bus(message: str, address: str) -> str:
    """A real record as the driver writes it for the GPU at `address`: its PCI
    address replaced, nothing else changed."""
    return _BUS.sub(address, message, count=1)


def escaped(message: str) -> str:
    """The message as /dev/kmsg shows it: a line break inside a record is `\\x0a`."""
    return message.replace("\\", "\\x5c").replace("\n", "\\x0a")


def record(sequence: int, uptime: float, message: str, level: int = 4) -> str:
    """One /dev/kmsg record, with a continuation line as device messages have."""
    return f"{level},{sequence},{int(uptime * 1e6)},-;{escaped(message)}\n SUBSYSTEM=pci\n"


def kernel_line(message: str, ago: str | None = None) -> str:
    """A scenario's kernel_line fault in YAML flow (the text JSON-quoted), at
    10 s, or `ago` before the start."""
    when = f"at: 0s, ago: {ago}" if ago else "at: 10s"
    return f"{{{when}, kind: kernel_line, text: {json.dumps(message)}}}"
