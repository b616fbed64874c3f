"""The full-mantissa GEMM, judged across the node's GPUs."""

from __future__ import annotations

from dataclasses import replace

from gpuwatchd.canary.crosscheck import DigestBook, crosscheck, scope
from gpuwatchd.canary.result import CanaryResult

GOOD, BAD = "a" * 64, "b" * 64


def digest_result(gpu: int, digest: str, environment: str = "H100; driver 550") -> CanaryResult:
    return CanaryResult(
        canary="gemm_random_fp32",
        kind="gemm_random",
        dtype="fp32",
        seed=1,
        shape=(64, 64, 64),
        result="pass",
        duration_seconds=0.01,
        gpu=gpu,
        digest=digest,
        environment=environment,
    )


def outcomes(results: tuple[CanaryResult, ...]) -> dict[int | None, str]:
    return {r.gpu: r.result for r in results}


def test_the_gpu_that_disagrees_with_the_others_mismatches() -> None:
    burst = [digest_result(0, GOOD), digest_result(1, BAD), digest_result(2, GOOD)]
    book, judged = crosscheck(DigestBook(), burst, quorum=2)
    assert outcomes(judged) == {0: "pass", 1: "mismatch", 2: "pass"}
    assert GOOD in (judged[1].message or "")
    assert list(book.reference.values()) == [GOOD]


def test_a_reference_agreed_before_judges_a_gpu_alone() -> None:
    book, _ = crosscheck(DigestBook(), [digest_result(0, GOOD), digest_result(2, GOOD)], quorum=2)
    _, judged = crosscheck(book, [digest_result(1, BAD)], quorum=2)
    assert outcomes(judged) == {1: "mismatch"}
    restored = DigestBook.from_json(book.to_json())
    assert crosscheck(restored, [digest_result(1, BAD)], quorum=2)[1][0].result == "mismatch"


def test_without_a_quorum_there_is_no_verdict() -> None:
    book, judged = crosscheck(
        DigestBook(), [digest_result(0, GOOD), digest_result(1, BAD)], quorum=2
    )
    assert outcomes(judged) == {0: "pass", 1: "pass"}
    assert book.reference == {}


def test_a_new_driver_or_library_is_never_a_failure() -> None:
    book, _ = crosscheck(DigestBook(), [digest_result(0, GOOD), digest_result(2, GOOD)], quorum=2)
    upgraded = [digest_result(gpu, BAD, "H100; driver 560") for gpu in (0, 1, 2)]
    book, judged = crosscheck(book, upgraded, quorum=2)
    assert outcomes(judged) == {0: "pass", 1: "pass", 2: "pass"}
    assert book.reference[scope(upgraded[0]) or ""] == BAD


def test_results_without_a_digest_pass_through() -> None:
    result = digest_result(0, GOOD)
    plain = replace(result, digest=None)
    assert crosscheck(DigestBook(), [plain], quorum=1)[1] == (plain,)
