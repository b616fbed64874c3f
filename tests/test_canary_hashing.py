"""The counter-based operands and the output digests (canary/hashing.py):
SplitMix64 as published, the C the GPU compiles making the host's bits
(compiled here by the host's C compiler), operands that use every bit of
their format, and digests that see any change of any word in any order."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpuwatchd.canary import hashing
from gpuwatchd.canary.hashing import FORMAT_CODES

C_COMPILER = shutil.which("cc") or shutil.which("gcc")
# The C functions as host code, reading (key, index, word) lines.
PROBE = r"""
#include <stdio.h>
int main(void) {
  unsigned long long key, i, word;
  while (scanf("%llx %llx %llx", &key, &i, &word) == 3) {
    unsigned long long r = gw_stream(key, i);
    printf("%llx %x %x %x %x %llx %llx\n", r, gw_fp16_bits(r), gw_bf16_bits(r),
           gw_fp32_bits(r), gw_tf32_bits(r), gw_fp64_bits(r), gw_fold(word, key, i));
  }
  return 0;
}
"""
HOST_DEFINES = "#define __host__\n#define __device__\n#define __forceinline__ inline\n"


def test_the_stream_is_splitmix64_as_published() -> None:
    # splitmix64.c seeded with 0 (the seeds of xoshiro's reference code).
    first = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    assert [int(x) for x in hashing.stream(0, 0, 4)] == first
    assert int(hashing.stream(0, 2, 1)[0]) == first[2]  # any element from its index alone
    assert hashing.mix64(GOLDEN := hashing.GOLDEN) == first[0] and GOLDEN


@pytest.mark.skipif(C_COMPILER is None, reason="no C compiler on this machine")
def test_the_c_the_gpu_compiles_makes_the_same_bits_as_the_host(tmp_path: Path) -> None:
    source = tmp_path / "probe.c"
    source.write_text(HOST_DEFINES + hashing.FUNCTIONS_SOURCE + PROBE)
    binary = tmp_path / "probe"
    assert C_COMPILER is not None
    compiled = subprocess.run(
        [C_COMPILER, "-std=c99", "-O2", "-Wall", "-Werror", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    rng = np.random.default_rng(3)
    keys = [int(k) for k in rng.integers(0, 2**63, size=200, dtype=np.int64)] + [0, 2**64 - 1]
    cases = [(key, int(rng.integers(0, 2**40)), int(rng.integers(0, 2**63))) for key in keys]
    ran = subprocess.run(
        [str(binary)],
        input="".join(f"{k:x} {i:x} {w:x}\n" for k, i, w in cases),
        capture_output=True,
        text=True,
        check=True,
    )
    for (key, index, word), line in zip(cases, ran.stdout.splitlines(), strict=True):
        random_bits = hashing.stream(key, index, 1)
        expected = [int(random_bits[0])]
        formats = ("fp16", "bf16", "fp32", "tf32", "fp64")  # the probe's order
        expected += [int(hashing.operand_bits(f, random_bits)[0]) for f in formats]
        expected.append(hashing.mix64(word ^ expected[0]))
        assert [int(x, 16) for x in line.split()] == expected


@pytest.mark.parametrize("fmt", sorted(FORMAT_CODES))
def test_operands_have_random_signs_every_mantissa_bit_and_magnitudes_below_one(fmt: str) -> None:
    values = hashing.host_operand(fmt, (256, 64, 128), 1, 0).astype(np.float64)
    assert values.shape == (256, 64)
    assert (np.abs(values) >= 2.0**-8).all() and (np.abs(values) < 1).all()
    assert (values < 0).mean() == pytest.approx(0.5, abs=0.02)
    mantissa_bits = {"fp16": 10, "bf16": 7, "tf32": 10, "fp32": 23, "fp64": 52}[fmt]
    fraction = np.frexp(np.abs(values))[0] * 2.0 ** (mantissa_bits + 1)
    assert (fraction == np.round(fraction)).all()  # no bit beyond the format's
    lowest = np.frexp(np.abs(values))[0] * 2.0 ** (mantissa_bits + 1) % 2
    assert 0 < lowest.mean() < 1  # and its last bit used
    assert sorted(set(np.frexp(np.abs(values))[1].ravel())) == list(range(-7, 1))


def test_any_rows_of_an_operand_are_those_rows_of_the_whole() -> None:
    whole = hashing.host_operand("fp32", (700, 32, 16), 5, 0)
    assert np.array_equal(
        hashing.host_operand("fp32", (700, 32, 16), 5, 0, slice(300, 601)), whole[300:601]
    )
    other = hashing.host_operand("fp32", (700, 32, 16), 6, 0)
    assert not np.array_equal(whole, other)  # the seed is in the key
    assert not np.array_equal(whole[:32], hashing.host_operand("fp32", (700, 32, 16), 5, 1)[:32])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint32])
def test_a_change_of_any_one_bit_of_any_word_changes_the_digest(dtype: type) -> None:
    rng = np.random.default_rng(1)
    width = np.dtype(dtype).itemsize
    words = rng.integers(0, 2**63, size=999, dtype=np.uint64).astype(f"u{width}")
    values = words.view(dtype)
    seen = hashing.digest_words(values)
    assert len(seen) == hashing.DIGEST_HEX_DIGITS
    for index in (0, 500, 998):
        for bit in (0, values.itemsize * 8 - 1):
            changed = words.copy()
            changed[index] ^= changed.dtype.type(1 << bit)
            other = hashing.digest_words(changed.view(values.dtype))
            assert other[:16] != seen[:16] and other[16:] != seen[16:]
    swapped = values.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert hashing.digest_words(swapped) != seen  # positions count, not only the words


def test_negative_zero_digests_as_zero_only_when_asked() -> None:
    values = np.array([1.0, 0.0, -2.0], dtype=np.float32)
    negative = np.array([1.0, -0.0, -2.0], dtype=np.float32)
    assert hashing.digest_words(negative) != hashing.digest_words(values)
    assert hashing.digest_words(negative, signless_zero=True) == hashing.digest_words(values)
