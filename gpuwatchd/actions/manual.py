"""Manual quarantine and release, as the API and the CLI take them: which
subject an operator means, whether it is on this node, and who they are."""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable

from gpuwatchd.model import GpuSample, PortSample, Quarantine
from gpuwatchd.policy import NODE, absent, validate_subject
from gpuwatchd.text import printable

# A reason becomes a metric label, a Slurm reason and a journal line: one
# readable line, of a size all of them take.
MAX_REASON_CHARS = 500


def resolve_subject(
    text: str, gpus: Iterable[GpuSample], quarantines: Iterable[Quarantine] = ()
) -> str:
    """A subject as policy names it: `gpu:<UUID>` becomes `gpu:<index>` by the
    GPUs given, or the subject of a quarantined board no longer on the node
    (`gpu:<UUID>`); anything else must already be a subject."""
    text = text.strip()
    if text.startswith("gpu:") and not text[4:].isdigit():
        uuid = text[4:].lower()

        def named(board: str | None) -> bool:
            return board is not None and uuid in (board.lower(), f"gpu-{board.lower()}")

        for gpu in gpus:
            if named(gpu.uuid):
                return gpu.subject
        for held in quarantines:
            if named(held.uuid) and absent(held.subject):
                return held.subject
        raise ValueError(f"no GPU with UUID {text[4:]} on this node")
    return validate_subject(text)


def node_subjects(gpus: Iterable[GpuSample], ports: Iterable[PortSample]) -> frozenset[str]:
    """Every subject the node has, by its samples."""
    subjects = {NODE}
    for gpu in gpus:
        subjects.add(gpu.subject)
        subjects.update(f"nvlink:{gpu.index}/{link.link}" for link in gpu.nvlinks)
    subjects.update(port.subject for port in ports)
    return frozenset(subjects)


def check_on_node(subject: str, known: frozenset[str], quarantined: Iterable[str]) -> None:
    """Refuse a subject the node does not have. A quarantined one is always
    accepted (a GPU that fell off the bus must still be releasable), and with
    no samples to go by (none taken yet) only the syntax is checked."""
    if subject in known or subject in set(quarantined) or known <= {NODE}:
        return
    raise ValueError(f"{subject} is not on this node")


def check_text(value: str, what: str, required: bool, max_chars: int = MAX_REASON_CHARS) -> str:
    """A reason or an operator's name: one line of at most `max_chars`."""
    value = value.strip()
    if required and not value:
        raise ValueError(f"a {what} is required")
    if len(value) > max_chars:
        raise ValueError(f"the {what} is longer than {max_chars} characters")
    if not printable(value):
        raise ValueError(f"the {what} must be one line of printable text (no control characters)")
    return value


def local_operator() -> str:
    """Who runs the CLI: the user behind sudo when there is one."""
    return os.environ.get("SUDO_USER") or getpass.getuser()
