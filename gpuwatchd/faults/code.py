"""What a fault code is: its id, the finding code it stands for, and what a
ticket needs to say about it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# `GW-` + the block (two digits: the area) + the number within it (two digits).
ID_PATTERN = re.compile(r"GW-(?P<block>[1-9][0-9])(?P<number>[0-9]{2})")


@dataclass(frozen=True)
class Block:
    """An area of the catalog: ids GW-<number>01 to GW-<number>99."""

    number: int
    name: str
    # Why a block holds no codes yet; "" for a block in use.
    reserved: str = ""


@dataclass(frozen=True)
class FaultCode:
    """One stable fault code. `id` never changes meaning: a finding code that
    goes away keeps its entry with `retired` saying when and why, and a new
    meaning gets a new id."""

    id: str
    check: str
    code: str  # the finding code (Finding.code)
    meaning: str
    evidence: str  # what the finding rests on, and the evidence keys it carries
    action: str  # what an operator does about it
    # NVIDIA's matching XID or RMA criterion, with its document; "" where NVIDIA has none.
    nvidia: str = ""
    retired: str = ""

    @property
    def block(self) -> int:
        matched = ID_PATTERN.fullmatch(self.id)
        if matched is None:
            raise ValueError(f"fault code id {self.id!r} is not GW-<block><number>")
        return int(matched["block"])
