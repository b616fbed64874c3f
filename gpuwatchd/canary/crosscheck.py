"""Judging the full-mantissa GEMM, which has no known answer.

Its output depends on the library's summation order, so it is compared
with what the other GPUs of the node (same model, driver and library: the
result's `environment`) computed from the same inputs, and with the digest
agreed on before in that environment. A digest that differs from the
agreed one is a mismatch. A new environment (a driver or library upgrade)
starts without an agreed digest: it is never a failure, and the first
digest that a quorum of GPUs shares becomes the reference.

This is what catches a consistent wrong answer on one GPU: checking a GPU
against its own earlier result (as gpu-burn does) cannot. The agreed
digests are worth keeping across restarts: `read_book` and `write_book`
keep them in a file of the state directory.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from gpuwatchd.canary.result import CanaryResult

log = logging.getLogger(__name__)

# The generator of the operands and the digest (hashing.py): a new one starts
# afresh rather than mismatching every GPU.
INPUTS = "inputs 3"


def scope(result: CanaryResult) -> str | None:
    """What a digest is comparable within; None for results without one. A
    `gemm_bounded` re-run computes the very product of its `gemm_random`
    on the same inputs: its digest is judged in that canary's scope."""
    if result.digest is None or result.environment is None:
        return None
    shape = "x".join(map(str, result.shape))
    canary = f"gemm_random_{result.dtype}" if result.kind == "gemm_bounded" else result.canary
    return f"{result.environment} | {INPUTS} | {canary} {shape} seed {result.seed}"


@dataclass(frozen=True)
class DigestBook:
    # Scope -> the digest agreed on (worth keeping across restarts).
    reference: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Scope -> target -> its latest digest.
    latest: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> str:
        return json.dumps(dict(self.reference), indent=1, sort_keys=True)

    def forget(self, canaries: Collection[str]) -> DigestBook:
        """The book without what it agreed on and saw for `canaries`: their
        digests are agreed afresh (a configuration or software change)."""

        def kept(key: str) -> bool:
            return not any(f"| {canary} " in key for canary in canaries)

        return DigestBook(
            MappingProxyType({k: v for k, v in self.reference.items() if kept(k)}),
            MappingProxyType({k: v for k, v in self.latest.items() if kept(k)}),
        )

    @classmethod
    def from_json(cls, text: str) -> DigestBook:
        data = json.loads(text)
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError("expected an object of scope -> digest")
        return cls(reference=MappingProxyType(data))


def _agreed(digests: Mapping[str, str], quorum: int) -> str | None:
    """The digest that at least `quorum` targets, and more than half of
    them, share."""
    if not digests:
        return None
    digest, count = Counter(digests.values()).most_common(1)[0]
    return digest if count >= quorum and count * 2 > len(digests) else None


def crosscheck(
    book: DigestBook, results: Sequence[CanaryResult], quorum: int
) -> tuple[DigestBook, tuple[CanaryResult, ...]]:
    """Record the passing digests of `results` and judge each against the
    agreed digest of its scope. `quorum` is how many GPUs must agree before a
    digest is agreed (2 on a multi-GPU node, 1 on a single-GPU one)."""
    latest = {key: dict(targets) for key, targets in book.latest.items()}
    for result in results:
        key = scope(result)
        if key is not None and result.result == "pass":
            latest.setdefault(key, {})[result.target] = result.digest or ""
    reference = dict(book.reference)
    for key, digests in latest.items():
        agreed = _agreed(digests, quorum)
        if key not in reference and agreed is not None:
            reference[key] = agreed
    judged = tuple(_judge(result, reference) for result in results)
    frozen = {key: MappingProxyType(targets) for key, targets in latest.items()}
    return DigestBook(MappingProxyType(reference), MappingProxyType(frozen)), judged


def _judge(result: CanaryResult, reference: Mapping[str, str]) -> CanaryResult:
    key = scope(result)
    agreed = reference.get(key) if key is not None else None
    if result.result != "pass" or agreed is None or result.digest == agreed:
        return result
    return replace(
        result,
        result="mismatch",
        mismatch_count=1,
        message=f"output digest {result.digest} differs from the agreed {agreed}",
    )


def read_book(path: Path | None) -> DigestBook:
    """The digests agreed before, from `path`; none when it is absent or
    unreadable (said in the log)."""
    if path is None:
        return DigestBook()
    try:
        return DigestBook.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return DigestBook()
    except (OSError, ValueError) as error:
        log.warning("ignoring canary digests in %s: %s", path, error)
        return DigestBook()


def write_book(path: Path | None, book: DigestBook) -> None:
    """Keep what `book` agreed on in `path`, replaced at once."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, delete=False, encoding="utf-8"
        ) as handle:
            handle.write(book.to_json())
        os.replace(handle.name, path)
    except OSError as error:
        log.warning("cannot keep canary digests in %s: %s", path, error)
