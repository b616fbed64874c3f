#!/usr/bin/env python3
"""Device check of gpuwatchd's SDC canaries on ONE NVIDIA GPU (an H100/H200).

Run from a checkout, on an image that has CuPy for its CUDA (cupy-cuda13x
or cupy-cuda12x), nvidia-ml-py, NumPy, click, psutil, PyYAML and
prometheus-client; no network and no install needed (PyTorch, where it is,
names the kernels and makes a training-like load):

    PYTHONPATH=$PWD python3 scripts/sdc-gpu-check.py --out "$OUT" --budget 480

It changes no GPU setting (no clocks, power limit, ECC, persistence, compute
mode, MPS or MIG) and never resets the GPU. Only JSON goes to --out (one
file, report.json, rewritten after every section so a cut-off run keeps
what it had); logs and anything else go to a scratch directory (--scratch,
a fresh temporary one by default, removed at the end).

Sections run in order of value, each in a process of its own (so CUDA is
never initialised in this one), each cut off at its own limit and at the
--budget deadline; a section for which too little time is left is skipped
and said to be:
  truth      the GPU's full-mantissa operands and digests against the host's,
             bit for bit; the exact GEMMs over 16 seeds and crafted cases;
             the INT8/FP8 tiles over 16 seeds; the FP8 accumulator sweep
             (e4m3 and e5m2: every k of both halves, sums built of many
             terms, negative terms, a nonzero C; raw output bits kept); the
             one-hot decode of the tiles' fragment layouts against
             a_positions/b_positions/c_positions; the SFU canary's worst error
  digests    the full-mantissa digests repeated, in fresh processes, under
             other CUBLAS_WORKSPACE_CONFIGs and with 0.5 GiB left free: the
             bitwise comparison between GPUs rests on their staying the same
  burst      the daemon's worker, cold then warm: per-canary device time (CUDA
             events, copies included) and pool memory, the burst's charge,
             the worker's CPU (RUSAGE_CHILDREN), GPU memory by NVML while it
             runs; then the host CPU of a burst in process (bench_canary)
  kernels    the CUDA kernels each GEMM of the suite runs (PyTorch's profiler;
             do the full-mantissa GEMMs run warpgroup kernels?), the cuBLASLt
             trace, how many SMs the chains reach (%smid)
  busy       a worker burst beside a PyTorch training-like load that leaves
             6 GiB free (what its caching allocator does meanwhile, the
             load's slowdown, the burst's charge and memory when
             time-sliced), and the CLI's burst at 0.75 GiB free (the CLI
             applies no min_free_bytes: a stress test)
  sfu_dense  __log2f and rsqrtf over every float of [0.5, 2), __sinf/__cosf
             on a dense grid of [-pi, pi], __expf on a grid of [-8, 8]: the
             worst error in units of the CUDA guide's bound, and where
  bounded    every full-mantissa GEMM of the suite within its fp64 bound
             (gemm_bounded must pass on a healthy GPU)
  sandbox    the CLI as shipped, the worker with an unwritable kernel cache,
             and under an unshare'd read-only root (may be refused: rc kept)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FORMATS_ORDER = ("fp16", "bf16", "tf32", "fp32", "fp64")
# Left for writing the report when the budget ends.
RESERVE_S = 15.0
# A section for which less than this is left is skipped.
MIN_SECTION_S = 20.0
Report = dict[str, Any]


def sh(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120.0) -> Report:
    """Run `cmd`; at `timeout` its whole process group is killed (a section's
    probes and loads must not outlive it on the GPU)."""
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            cmd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as error:  # no such program (nvidia-smi, unshare)
        return {"rc": 127, "seconds": 0.0, "stdout": "", "stderr": str(error)}
    try:
        out, err = process.communicate(timeout=timeout)
        rc = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        rc, err = 124, f"timeout after {timeout:.0f} s; " + err[-2000:]
    return {
        "rc": rc,
        "seconds": round(time.monotonic() - start, 2),
        "stdout": out,
        "stderr": err[-3000:],
    }


def backend() -> Any:
    from gpuwatchd.canary.cuda import CudaBackend

    return CudaBackend(0)


def capability() -> tuple[int, int]:
    import cupy as cp

    properties = cp.cuda.runtime.getDeviceProperties(0)
    return int(properties["major"]), int(properties["minor"])


# ---------------------------------------------------------------- truth
def section_truth(scratch: Path) -> Report:
    be = backend()
    cc = capability()
    report: Report = {"device": device_info(be, cc)}
    report["operands_and_digests"] = operands_and_digests(be)
    report["exact"] = exact_rows(be)
    report["crafted"] = crafted_rows(be)
    report["mma"] = mma_rows(be, cc)
    report["layout"] = layout_decode(be, cc)
    report["fp8_sweep"] = fp8_sweep(be, cc)
    report["sfu"] = sfu_rows(be)
    report["wrong"] = [row for row in report["exact"] + report["mma"] if row.get("mismatches")]
    return report


def device_info(be: Any, cc: tuple[int, int]) -> Report:
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    properties = cp.cuda.runtime.getDeviceProperties(0)
    free, total = cp.cuda.runtime.memGetInfo()
    return {
        "name": be.info.name,
        "sm_count": be.info.sm_count,
        "compute_capability": f"{cc[0]}.{cc[1]}",
        "uuid_bytes": len(properties.get("uuid", b"")),
        "cupy": cp.__version__,
        "runtime": cp.cuda.runtime.runtimeGetVersion(),
        "driver": cp.cuda.runtime.driverGetVersion(),
        "cublas": cublas.getVersion(cp.cuda.device.get_cublas_handle()),
        "environment": be.info.environment,
        "context_free_mib": round(free / 2**20),
        "total_mib": round(total / 2**20),
    }


def operands_and_digests(be: Any) -> list[Report]:
    """The GPU's operand kernels against hashing.host_operand (the first and
    last 512 rows of each operand), and its digest kernel against the host's
    digest of the same output."""
    import cupy as cp

    from gpuwatchd.canary import hashing
    from gpuwatchd.canary.formats import FORMATS
    from gpuwatchd.canary.spec import CUDA_SIZE

    shape = CUDA_SIZE.gemm_random
    rows = []
    for name in FORMATS_ORDER:
        fmt = FORMATS[name]
        for operand in (0, 1):
            device = cp.asnumpy(be.device_operand(fmt, shape, 1, operand))
            height = device.shape[0]
            agree = True
            for part in (slice(0, 512), slice(height - 512, height)):
                host = hashing.host_operand(name, shape, 1, operand, part)
                host_words = host.view(f"u{host.dtype.itemsize}")
                if name == "bf16":
                    host_words = host_words >> np.uint32(16)
                words = device[part].view(f"u{device.dtype.itemsize}")
                agree = agree and bool(np.array_equal(words, host_words.astype(words.dtype)))
            rows.append({"fmt": name, "operand": "AB"[operand], "agrees_with_host": agree})
        run = be.random_gemm(fmt, shape, 1)
        on_device, output = run.output.digest(), run.output.fetch()
        rows.append(
            {
                "fmt": name,
                "digest_device": on_device,
                "digest_agrees_with_host": on_device == hashing.digest_words(output),
                "tflops": round(2 * shape[0] * shape[1] * shape[2] / run.seconds / 1e12, 1),
            }
        )
    return rows


def _result_row(result: Any) -> Report:
    return {
        "canary": result.canary,
        "seed": result.seed,
        "shape": "x".join(map(str, result.shape)),
        "result": result.result,
        "mismatches": result.mismatch_count,
        "first": [
            result.first_mismatch_index,
            result.first_expected_bits,
            result.first_actual_bits,
        ],
        "device_ms": None
        if result.device_seconds is None
        else round(result.device_seconds * 1e3, 3),
        "message": result.message,
    }


def exact_rows(be: Any) -> list[Report]:
    from gpuwatchd.canary.spec import CUDA_SIZE, CanarySpec
    from gpuwatchd.canary.suite import RunContext, run_canary

    context = RunContext()  # references wherever BLAS runs them: every core
    rows = []
    for name in FORMATS_ORDER:
        for seed in range(1, 17):
            spec = CanarySpec("gemm_exact", name, CUDA_SIZE.gemm_exact, seed)
            rows.append(_result_row(run_canary(be, spec, context)))
        # GPU-filling, and a k that invites split-K (fp32's limit is 2048).
        for shape in ((4096, 512, 4096), (256, 2048, 256)):
            spec = CanarySpec("gemm_exact", name, shape, 3)
            rows.append(_result_row(run_canary(be, spec, context)))
    return rows


def crafted_rows(be: Any) -> list[Report]:
    """Cases the canaries never have: the top accumulator bits, one past the
    bound, exact cancellations (the sign of zero), exponent spread inside one
    dot product (RN against truncation)."""
    from gpuwatchd.canary.formats import FORMATS

    def gemm(name: str, a: list[list[float]], b: list[list[float]]) -> float:
        output = be.gemm(FORMATS[name], np.array(a), np.array(b)).output.fetch()
        return float(output[0, 0])

    top = (
        [[2048, 2048, 2048, 2047, 1, 1, 1, 1]],
        [[2048], [2048], [2048], [2048], [1], [1], [1], [1]],
    )
    past = ([[2048, 2048, 2048, 2048, 1, 1, 1]], [[2048], [2048], [2048], [2048], [1], [1], [1]])
    cancel = ([[x for v in range(1, 33) for x in (v * 3, -v * 3)]], [[5]] * 64)
    cancel_negative_first = ([[x for v in range(1, 33) for x in (-v * 3, v * 3)]], [[5]] * 64)
    rows: list[Report] = []
    for name in ("fp16", "tf32", "fp32"):
        rows.append(
            {
                "fmt": name,
                "case": "2^24-2044 (exact)",
                "got": gemm(name, *top),
                "exact": 2**24 - 2044,
            }
        )
        rows.append({"fmt": name, "case": "2^24+3: RN 2^24+4, RZ 2^24+2", "got": gemm(name, *past)})
    for name in FORMATS_ORDER:
        for label, case in (
            ("cancellation", cancel),
            ("cancellation, negative first", cancel_negative_first),
        ):
            got = gemm(name, *case)
            rows.append(
                {"fmt": name, "case": label, "got": got, "negative_zero": bool(np.signbit(got))}
            )
    for name in ("fp16", "bf16", "tf32"):
        for second, label in (
            (2.0**-2, "2^20 + 2^-3 (exact)"),
            (3 * 2.0**-4, "2^20 + 3*2^-5 (RN vs RZ)"),
        ):
            got = gemm(name, [[1024.0, second]], [[1024.0], [0.5]])
            exact = 2.0**20 + second * 0.5
            rows.append(
                {"fmt": name, "case": label, "got": got, "delta_in_ulps": (got - exact) / 2.0**-3}
            )
    return rows


def mma_rows(be: Any, cc: tuple[int, int]) -> list[Report]:
    from gpuwatchd.canary.spec import CUDA_SIZE, MMA_DTYPES, CanarySpec, mma_supported
    from gpuwatchd.canary.suite import RunContext, run_canary

    rows: list[Report] = []
    for dtype in MMA_DTYPES:
        if not mma_supported(dtype, cc):
            rows.append({"canary": f"mma_{dtype}", "skipped": f"compute capability {cc}"})
            continue
        for seed in range(16):
            result = run_canary(be, CanarySpec("mma", dtype, CUDA_SIZE.mma, seed), RunContext())
            rows.append({**_result_row(result), "sm_coverage": result.sm_coverage_ratio})
    return rows


def _tiles(
    be: Any, name: str, a_bytes: np.ndarray, b_bytes: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """D = A * B + C through the tile kernel `name` (a canary's, or e5m2's
    compiled here), as an (m, n) matrix."""
    from gpuwatchd.canary import mma

    if name in mma.MMA_FORMATS:
        fmt = mma.MMA_FORMATS[name]
        inputs = mma.MmaInputs(
            fmt, mma.pack_a(a_bytes), mma.pack_b(b_bytes), mma.pack_c(c.astype(fmt.output))
        )
        values = be.mma(inputs).values.fetch()
    else:
        values = _e5m2_tiles(
            mma.pack_a(a_bytes), mma.pack_b(b_bytes), mma.pack_c(c.astype(np.float32))
        )
    return mma.unpack_c(values, a_bytes.shape[0], b_bytes.shape[1])


def _e5m2_tiles(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    import cupy as cp

    from gpuwatchd.canary import mma

    source = mma.tile_source("fp8_e5m2", "f32.e5m2.e5m2.f32", np.float32, (8, 9))
    kernel = cp.RawModule(code=source).get_function("mma_fp8_e5m2")
    tiles_n, warps = b.shape[0], a.shape[0] * b.shape[0]
    threads = warps * 32
    out = cp.empty((threads, 4), dtype=cp.float32)
    sm = [cp.empty(threads, dtype=cp.uint32) for _ in range(2)]
    args = (
        cp.asarray(a),
        cp.asarray(b),
        cp.asarray(c),
        np.int32(tiles_n),
        np.int32(warps),
        out,
        *sm,
    )
    kernel((-(-threads // 256),), (256,), args)
    return cp.asnumpy(out)


def layout_decode(be: Any, cc: tuple[int, int]) -> Report:
    """Every pair of one-hot A and B fragments (512 A positions x 256 B
    positions, a warp each, one launch): the hardware's D is nonzero exactly
    where the PTX tables, as gpuwatchd packs them, say it is."""
    from gpuwatchd.canary import mma
    from gpuwatchd.canary.spec import MMA_DTYPES, mma_supported

    report: Report = {}
    a_rows, a_cols = mma.a_positions()
    b_rows, b_cols = mma.b_positions()
    c_rows, c_cols = mma.c_positions()
    one = {"int8": 1, "fp8_e4m3": 0x38}  # 1 and 1.0
    for dtype in MMA_DTYPES:
        if not mma_supported(dtype, cc):
            report[dtype] = {"skipped": f"compute capability {cc}"}
            continue
        fmt = mma.MMA_FORMATS[dtype]
        a_words = np.zeros((512, 32, 16), dtype=np.uint8)
        a_words.reshape(512, 512)[np.arange(512), np.arange(512)] = one[dtype]
        b_words = np.zeros((256, 32, 8), dtype=np.uint8)
        b_words.reshape(256, 256)[np.arange(256), np.arange(256)] = one[dtype]
        inputs = mma.MmaInputs(
            fmt,
            a_words.view(np.uint32).reshape(512, 32, 4),
            b_words.view(np.uint32).reshape(256, 32, 2),
            np.zeros((512 * 256 * 32, 4), dtype=fmt.output),
        )
        got = be.mma(inputs).values.fetch().reshape(512, 256, 32, 4) != 0
        expected = np.zeros_like(got)
        a_lane, a_i = np.divmod(np.arange(512), 16)
        b_lane, b_i = np.divmod(np.arange(256), 8)
        for a in range(512):
            row, k = a_rows[a_lane[a], a_i[a]], a_cols[a_lane[a], a_i[a]]
            for b in np.flatnonzero(b_rows[b_lane, b_i] == k):
                column = b_cols[b_lane[b], b_i[b]]
                expected[a, b] = (c_rows == row) & (c_cols == column)
        differ = np.flatnonzero((got != expected).any(axis=(2, 3)).ravel())
        report[dtype] = {
            "agrees_with_ptx_tables": differ.size == 0,
            "warps_differing": int(differ.size),
            "first_differing": [
                {
                    "a_lane_byte": list(divmod(int(w) // 256, 16)),
                    "b_lane_byte": list(divmod(int(w) % 256, 8)),
                    "nonzero_lane_register": np.argwhere(got.reshape(-1, 32, 4)[w]).tolist(),
                }
                for w in differ[:8]
            ],
        }
    return report


def _e4m3(values: np.ndarray) -> np.ndarray:
    from gpuwatchd.canary import mma

    nonzero = np.where(values == 0, 1.0, values)
    return np.where(values == 0, 0, mma.e4m3_bits(nonzero)).astype(np.uint8)


def _e5m2(values: np.ndarray) -> np.ndarray:
    """e5m2 codes of exact values (bias 15, 2 mantissa bits); 0 for zero."""
    magnitude = np.abs(values)
    mantissa, exponent = np.frexp(np.where(magnitude == 0, 1.0, magnitude))
    fraction = mantissa * 8 - 4
    if np.any(fraction != np.round(fraction)) or np.any((exponent + 14 < 1) | (exponent + 14 > 30)):
        raise ValueError("a value is not a normal e5m2 number")
    code = (
        (values < 0).astype(np.uint8) << 7
        | ((exponent + 14).astype(np.uint8) << 2)
        | fraction.astype(np.uint8)
    )
    return np.where(magnitude == 0, 0, code).astype(np.uint8)


def _sweep_cases() -> Iterator[tuple[str, int, list[float], float]]:
    """(family, bits the exact sum needs, a row of A, C) for B = 16 everywhere."""
    for h in range(2, 9):
        for small in range(32):
            for family, big in (("other half", (small + 16) % 32), ("same half", small ^ 1)):
                row = [0.0] * 32
                row[big], row[small] = 2.0**h, 1.0
                yield f"2^{h} + 1, {family}", h + 1, row, 0.0
            row = [0.0] * 32
            row[(small + 16) % 32], row[small] = 2.0**h, -1.0
            yield f"2^{h} - 1 (truncation)", h, row, 0.0
    for q in range(9):
        for count in range(2, 33):
            row = [2.0**q] * (count - 1) + [1.0] + [0.0] * (32 - count)
            yield f"{count - 1} x 2^{q} + 1", ((count - 1) * 2**q + 1).bit_length(), row, 0.0
    for h in range(2, 15):
        for small in range(32):
            row = [0.0] * 32
            row[small] = 1.0
            yield f"C 2^{h} + 1", h + 1, row, 16.0 * 2.0**h


def fp8_sweep(be: Any, cc: tuple[int, int]) -> Report:
    """How many bits the FP8 accumulator keeps, where: each dot product's
    exact sum needs a known number of significant bits (the canary assumes
    12); kept as raw output bits."""
    if cc < (8, 9):
        return {"skipped": f"compute capability {cc}"}
    cases = list(_sweep_cases())
    rows = -(-len(cases) // 16) * 16
    a = np.zeros((rows, 32))
    c = np.zeros((rows, 8))
    for i, (_, _, row, accumulator) in enumerate(cases):
        a[i], c[i] = row, accumulator
    b = np.full((32, 8), 16.0)
    report: Report = {}
    for name, encode in (("fp8_e4m3", _e4m3), ("fp8_e5m2", _e5m2)):
        got = _tiles(be, name, encode(a), encode(b), c)[: len(cases), 0]
        exact = a[: len(cases)] @ b[:, 0] + c[: len(cases), 0]
        report[name] = _sweep_summary(cases, got.astype(np.float32), exact)
    return report


def _sweep_summary(
    cases: list[tuple[str, int, list[float], float]], got: np.ndarray, exact: np.ndarray
) -> Report:
    by_bits: dict[int, list[int]] = {}
    wrong: list[Report] = []
    for i, (label, bits, _, _) in enumerate(cases):
        right = float(got[i]) == float(exact[i])
        by_bits.setdefault(bits, [0, 0])[0 if right else 1] += 1
        if not right and len(wrong) < 40:
            small = [k for k, v in enumerate(cases[i][2]) if v in (1.0, -1.0)]
            wrong.append(
                {
                    "case": label,
                    "k": small,
                    "exact": float(exact[i]),
                    "got": float(got[i]),
                    "bits": hex(int(got[i : i + 1].view(np.uint32)[0])),
                }
            )
    exact_up_to = 0
    for bits in sorted(by_bits):
        if by_bits[bits][1]:
            break
        exact_up_to = bits
    return {
        "exact_up_to_bits": exact_up_to,
        "right_wrong_by_bits": {str(b): v for b, v in sorted(by_bits.items())},
        "first_wrong": wrong,
    }


def sfu_rows(be: Any) -> list[Report]:
    """The SFU canary over 4 seeds of 2^20 threads, and each function's worst
    error as a share of its documented bound (the canary fails at MARGIN)."""
    from gpuwatchd.canary import sfu
    from gpuwatchd.canary.spec import CanarySpec
    from gpuwatchd.canary.suite import RunContext, run_canary

    rows: list[Report] = []
    for seed in range(4):
        result = run_canary(be, CanarySpec("sfu", "fp32", (1 << 20,), seed), RunContext())
        inputs = sfu.sfu_inputs(1 << 20, seed)
        rows.append({**_result_row(result), "worst_over_bound": _sfu_worst(be, inputs)})
    return rows


def _sfu_worst(be: Any, inputs: Any) -> Report:
    from gpuwatchd.canary import sfu

    values = be.sfu(inputs).values.fetch().astype(np.float64)
    exact = sfu.sfu_reference(inputs)
    ratio = np.abs(values - exact) / (sfu.tolerance(inputs, exact) / sfu.MARGIN)
    argument = {
        "sin": inputs.angle,
        "cos": inputs.angle,
        "log2": inputs.scale,
        "exp": inputs.power,
        "rsqrt": inputs.scale,
    }
    worst: Report = {}
    for column, name in enumerate(sfu.FUNCTIONS):
        where = int(np.nanargmax(ratio[:, column]))
        worst[name] = {
            "worst_over_documented_bound": round(float(ratio[where, column]), 4),
            "at": float(argument.get(name, inputs.angle)[where]),
            "over_bound": int((ratio[:, column] > 1).sum()),
            "over_margin": int((ratio[:, column] > sfu.MARGIN).sum()),
        }
    return worst


# ---------------------------------------------------------------- digests
DIGEST_PROBE = r"""
import json, os, sys
import cupy as cp
cp.cuda.Device(0).use()
if os.environ.get("PRESSURE_GIB"):
    free, _ = cp.cuda.runtime.memGetInfo()
    cp.cuda.runtime.malloc(max(0, free - int(float(os.environ["PRESSURE_GIB"]) * 2**30)))
from gpuwatchd.canary.cuda import CudaBackend
from gpuwatchd.canary.formats import FORMATS
from gpuwatchd.canary.spec import CUDA_SIZE
be = CudaBackend(0)
out = {}
for name in ("fp16", "bf16", "tf32", "fp32", "fp64"):
    for seed in (1, 2):
        runs = [
            be.random_gemm(FORMATS[name], CUDA_SIZE.gemm_random, seed).output.digest()
            for _ in range(int(sys.argv[1]))
        ]
        out[f"{name} seed {seed}"] = sorted(set(runs))
        be.release()
print(json.dumps(out))
"""


def section_digests(scratch: Path) -> Report:
    variants = {
        "in_process_x5": ({}, 5),
        "fresh_process_1": ({}, 1),
        "fresh_process_2": ({}, 1),
        "workspace_4096_8": ({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, 1),
        "workspace_16_8": ({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, 1),
        "pressure_0.5GiB_free": ({"PRESSURE_GIB": "0.5"}, 1),
    }
    seen: Report = {}
    for label, (env, repeats) in variants.items():
        ran = sh([sys.executable, "-c", DIGEST_PROBE, str(repeats)], env, 120)
        try:
            seen[label] = json.loads(ran["stdout"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            seen[label] = {"rc": ran["rc"], "stderr": ran["stderr"][-800:]}
    keys = {
        key
        for digests in seen.values()
        if isinstance(digests, dict)
        for key in digests
        if key not in ("rc", "stderr")
    }
    agree = {
        key: len({d for digests in seen.values() for d in digests.get(key, [])}) == 1
        for key in sorted(keys)
    }
    return {"variants": seen, "one_digest_each": agree}


# ---------------------------------------------------------------- burst
@contextmanager
def nvml_memory() -> Iterator[Report]:
    """GPU 0's used memory by NVML, polled every 50 ms while the block runs:
    the device's, and each process's (the worker's context and pool)."""
    import pynvml

    figures: Report = {"device_used_mib_max": None, "process_used_mib_max": {}}
    stop = threading.Event()

    def poll() -> None:
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            figures["device_used_mib_before"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20
            while not stop.wait(0.05):
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20
                figures["device_used_mib_max"] = max(used, figures["device_used_mib_max"] or 0)
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    mib = (process.usedGpuMemory or 0) // 2**20
                    known = figures["process_used_mib_max"].get(str(process.pid), 0)
                    figures["process_used_mib_max"][str(process.pid)] = max(known, mib)
        except Exception as error:
            figures["nvml_error"] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield figures
    finally:
        stop.set()
        thread.join(timeout=5)


def worker_burst(
    kernel_cache: str | None, wrap: list[str] | None = None, timeout: float = 150.0
) -> Report:
    """The daemon's worker on GPU 0 with its suite, as the agent starts it."""
    from gpuwatchd.canary.config import CanaryConfig
    from gpuwatchd.canary.modes import compute_capability, nvml_gpus
    from gpuwatchd.canary.result import CanaryResult
    from gpuwatchd.canary.runner import WORKER_MODULE, BurstRequest, worker_environment
    from gpuwatchd.canary.spec import default_suite
    from gpuwatchd.canary.wire import from_wire, to_wire

    config = CanaryConfig()
    request = BurstRequest(
        "cuda",
        default_suite("cuda", 1, 1, config.hbm_bytes, compute_capability(0)),
        gpu=0,
        uuid=dict(nvml_gpus()).get(0),
        kernel_cache=kernel_cache,
        jit_cache=None
        if kernel_cache is None
        else str(Path(kernel_cache).parent / "cuda-jit-cache"),
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with nvml_memory() as memory:
        ran = subprocess.run(
            [*(wrap or []), sys.executable, "-m", WORKER_MODULE],
            input=json.dumps(to_wire(request)),
            env=worker_environment(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    results = [from_wire(CanaryResult, m["result"]) for m in lines if m.get("event") == "result"]
    charged = sum(
        r.duration_seconds if r.device_seconds is None else r.device_seconds for r in results
    )
    held = [r.device_memory_bytes for r in results if r.device_memory_bytes is not None]
    return {
        "rc": ran.returncode,
        "wall_s": round(time.monotonic() - start, 2),
        "worker_cpu_s": round(
            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2
        ),
        "charged_device_s": round(charged, 4),
        "pool_peak_mib": round(max(held) / 2**20, 1) if held else None,
        "nvml": memory,
        "stderr": ran.stderr[-1500:],
        "canaries": [
            {
                "canary": r.canary,
                "result": r.result,
                "duration_ms": round(r.duration_seconds * 1e3, 2),
                "device_ms": None if r.device_seconds is None else round(r.device_seconds * 1e3, 3),
                "pool_mib": None
                if r.device_memory_bytes is None
                else round(r.device_memory_bytes / 2**20, 1),
                "tflops": r.tflops,
                "message": r.message,
            }
            for r in results
        ],
    }


def section_burst(scratch: Path) -> Report:
    state = scratch / "state"
    state.mkdir(exist_ok=True)
    cache = str(state / "cupy-kernel-cache")
    report: Report = {"cold": worker_burst(cache), "warm": worker_burst(cache)}
    sys.path.insert(0, str(REPO / "bench"))
    from bench_canary import cuda_host_bursts

    report["in_process_host"] = cuda_host_bursts(3)
    return report


# ---------------------------------------------------------------- kernels
def section_kernels(scratch: Path) -> Report:
    report: Report = {
        "kernels": gemm_kernels(),
        "smid": sh([sys.executable, "-c", SMID_PROBE], timeout=60),
    }
    log = scratch / "cublaslt.log"
    report["cublaslt_log_tail"] = log.read_text(errors="replace")[-6000:] if log.exists() else None
    return report


def gemm_kernels() -> Report:
    """The CUDA kernels each GEMM of the suite launches, by PyTorch's
    profiler (CUPTI sees every kernel of the process, CuPy's cuBLAS calls
    included)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as error:
        return {"error": f"no PyTorch: {error}"}
    import cupy as cp

    from gpuwatchd.canary.formats import FORMATS
    from gpuwatchd.canary.gemm import exact_gemm
    from gpuwatchd.canary.spec import CUDA_SIZE

    torch.cuda.init()
    be = backend()
    calls: dict[str, Callable[[], object]] = {}
    for name in FORMATS_ORDER:
        inputs = exact_gemm(FORMATS[name], CUDA_SIZE.gemm_exact, 1)
        calls[f"gemm_exact_{name}"] = lambda f=FORMATS[name], i=inputs: be.gemm(f, i.a, i.b)
        calls[f"gemm_random_{name}"] = lambda f=FORMATS[name]: be.random_gemm(
            f, CUDA_SIZE.gemm_random, 1
        )
    report: Report = {}
    for label, call in calls.items():
        call()  # first call: cuBLAS's heuristics and loading, outside the profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            cp.cuda.Device().synchronize()
        names = sorted(
            {event.name for event in prof.events() if str(event.device_type).endswith("CUDA")}
        )
        gemms = [n for n in names if not n.startswith(("operand_", "digest"))]
        report[label] = {
            "kernels": names,
            "warpgroup": any(
                ("sm90" in n or "sm100" in n or "warpgroup" in n or "wgmma" in n) for n in gemms
            ),
        }
        be.release()
    return report


SMID_PROBE = r"""
import cupy as cp, json, numpy as np
from gpuwatchd.canary.chains import int_chain_inputs
from gpuwatchd.canary.cuda import CudaBackend
be = CudaBackend(0)
run = be.int_chain(int_chain_inputs(65536, 1024, 1))
k = cp.RawKernel(r'''extern "C" __global__ void where(unsigned* sm, unsigned* nsm) {
  unsigned s, n;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(n));
  long long t0 = clock64(); while (clock64() - t0 < 200000) {}
  if (threadIdx.x == 0) { sm[blockIdx.x] = s; nsm[blockIdx.x] = n; } }''', "where")
sms = be.info.sm_count; sm = cp.zeros(4 * sms, cp.uint32); nsm = cp.zeros(4 * sms, cp.uint32)
k((4 * sms,), (128,), (sm, nsm)); sm, nsm = cp.asnumpy(sm), cp.asnumpy(nsm)
u = np.unique(run.units[run.units >= 0])
print(json.dumps({"sm_count": sms, "chain_distinct_smid": int(u.size),
                  "chain_max_smid": int(u.max()),
                  "chain_threads_moved": int((run.units < 0).sum()),
                  "probe_distinct_smid": int(np.unique(sm).size), "probe_max_smid": int(sm.max()),
                  "nsmid": int(nsm.max())}))
"""


# ---------------------------------------------------------------- busy
TORCH_LOAD = r"""
import json, sys, time, torch
leave, seconds, path = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
w = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(4)]

def step():
    y = x
    for layer in w:
        y = torch.relu(y @ layer)  # fresh activations each step: the caching allocator's pattern
    torch.cuda.synchronize()

step()
# The rest of the GPU held as a training job's weights and optimizer state
# would hold it, but `leave` GiB (the daemon bursts a busy GPU from 4 GiB free).
free, _ = torch.cuda.mem_get_info()
held = torch.empty(max(0, free - int(leave * 2**30)), dtype=torch.uint8, device="cuda")
rows, end = [], time.time() + seconds
while time.time() < end:
    t = time.perf_counter()
    step()
    free, total = torch.cuda.mem_get_info()
    rows.append((time.time(), time.perf_counter() - t, free, torch.cuda.memory_reserved()))
json.dump(rows, open(path, "w"))
"""

CUPY_LOAD = r"""
import cupy as cp, json, sys, time
leave, seconds, path = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
a = cp.random.random((8192, 8192), dtype=cp.float32).astype(cp.float16); c = a @ a
free, _ = cp.cuda.runtime.memGetInfo()
cp.cuda.runtime.malloc(max(0, free - int(leave * 2**30)))
rows, end = [], time.time() + seconds
while time.time() < end:
    t = time.perf_counter(); c = a @ a; cp.cuda.Device().synchronize()
    rows.append((time.time(), time.perf_counter() - t, cp.cuda.runtime.memGetInfo()[0], 0))
json.dump(rows, open(path, "w"))
"""


def beside_load(
    load: str, arguments: list[str], burst: Callable[[], Report], scratch: Path, label: str
) -> Report:
    trace = scratch / f"load_{label}.json"
    process = subprocess.Popen([sys.executable, "-c", load, *arguments, str(trace)])
    time.sleep(8)
    t0 = time.time()
    result = burst()
    t1 = time.time()
    process.wait(timeout=120)
    rows = json.loads(trace.read_text()) if trace.exists() else []
    during = [d for t, d, _, _ in rows if t0 <= t <= t1]
    outside = [d for t, d, _, _ in rows if t < t0 - 1 or t > t1 + 1]
    free = [f for _, _, f, _ in rows]
    return {
        "burst": result,
        "load_rc": process.returncode,
        "load_step_ms_outside": round(1e3 * float(np.median(outside)), 2) if outside else None,
        "load_step_ms_during": round(1e3 * float(np.median(during)), 2) if during else None,
        "load_free_gib_min": round(min(free) / 2**30, 3) if free else None,
        "load_free_gib_median": round(float(np.median(free)) / 2**30, 3) if free else None,
        "load_reserved_gib_max": round(max(r for *_, r in rows) / 2**30, 3) if rows else None,
    }


def section_busy(scratch: Path) -> Report:
    report: Report = {}
    try:
        import torch  # noqa: F401  (only to know it is there)

        report["beside_torch_training_load_6GiB_free"] = beside_load(
            TORCH_LOAD, ["6", "45"], lambda: worker_burst(None, timeout=120), scratch, "torch"
        )
    except ImportError as error:
        report["beside_torch_training_load_6GiB_free"] = {"error": f"no PyTorch: {error}"}
    # The CLI applies no min_free_bytes (the daemon skips a busy GPU with
    # less than 4 GiB free): a stress test of 0.75 GiB, not the daemon's case.
    report["cli_at_0.75GiB_free"] = beside_load(
        CUPY_LOAD, ["0.75", "40"], lambda: cli_burst({}, 60), scratch, "cupy"
    )
    return report


# ---------------------------------------------------------------- sfu_dense
def section_sfu_dense(scratch: Path) -> Report:
    from gpuwatchd.canary.sfu import SfuInputs

    count = 1 << 24
    inputs = SfuInputs(
        angle=np.linspace(-np.pi, np.pi, count, dtype=np.float32),
        # Every float of [0.5, 2): 0x3F000000 is 0.5, 2^24 words later 2.0.
        scale=(np.arange(count, dtype=np.uint32) + np.uint32(0x3F000000)).view(np.float32),
        power=np.linspace(-8.0, 8.0, count, dtype=np.float32),
    )
    return {"threads": count, "worst": _sfu_worst(backend(), inputs)}


# ---------------------------------------------------------------- bounded
def section_bounded(scratch: Path) -> Report:
    from gpuwatchd.canary.spec import CUDA_SIZE, CanarySpec
    from gpuwatchd.canary.suite import RunContext, run_canary

    be = backend()
    rows = []
    for name in FORMATS_ORDER:
        start = time.monotonic()
        result = run_canary(
            be, CanarySpec("gemm_bounded", name, CUDA_SIZE.gemm_random, 1), RunContext()
        )
        rows.append({**_result_row(result), "seconds": round(time.monotonic() - start, 1)})
    return {"gemm_bounded": rows}


# ---------------------------------------------------------------- sandbox
def cli_burst(env: dict[str, str], timeout: float = 150.0) -> Report:
    ran = sh(
        [sys.executable, "-m", "gpuwatchd.canary.cli", "--backend", "cuda", "--gpu", "0", "--json"],
        env,
        timeout,
    )
    try:
        results = json.loads(ran["stdout"])
        ran["results"] = [
            {
                k: x.get(k)
                for k in (
                    "canary",
                    "result",
                    "duration_seconds",
                    "device_seconds",
                    "tflops",
                    "message",
                )
            }
            for x in results
        ]
    except ValueError:
        ran["results"] = None
    ran["stdout"] = ran["stdout"][-2000:]
    return ran


def section_sandbox(scratch: Path) -> Report:
    state = scratch / "sandbox-state"
    state.mkdir(exist_ok=True)
    cache = str(state / "cupy-kernel-cache")
    sandbox = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind "$0" "$0" && mount -o remount,bind,ro / && exec "$@"',
        str(state),
    ]
    return {
        "cli_as_shipped": cli_burst({}),
        # Expect the first canary's error: its digest is the first kernel.
        "worker_unwritable_cache": worker_burst("/proc/gpuwatchd-no-cache"),
        "worker_read_only_root": worker_burst(cache, sandbox),
    }


# ---------------------------------------------------------------- driver
SECTIONS: list[tuple[str, float, Callable[[Path], Report]]] = [
    ("truth", 170.0, section_truth),
    ("digests", 100.0, section_digests),
    ("burst", 120.0, section_burst),
    ("kernels", 90.0, section_kernels),
    ("busy", 150.0, section_busy),
    ("sfu_dense", 80.0, section_sfu_dense),
    ("bounded", 120.0, section_bounded),
    ("sandbox", 90.0, section_sandbox),
]
SECTION_ENV = {
    "kernels": lambda scratch: {
        "CUBLASLT_LOG_LEVEL": "2",
        "CUBLASLT_LOG_FILE": str(scratch / "cublaslt.log"),
    },
}


def run_section(name: str, scratch: Path) -> None:
    """In the section's own process: its report to scratch/<name>.json."""
    function = dict((n, f) for n, _, f in SECTIONS)[name]
    start = time.monotonic()
    report = function(scratch)
    report["seconds"] = round(time.monotonic() - start, 1)
    (scratch / f"{name}.json").write_text(json.dumps(report, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where report.json goes (and nothing else)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument(
        "--scratch", help="for logs and load traces (default: a temporary directory)"
    )
    parser.add_argument(
        "--sections", default=",".join(n for n, _, _ in SECTIONS), help="comma list, in order"
    )
    parser.add_argument("--section", help=argparse.SUPPRESS)  # a section's own process
    args = parser.parse_args()
    if args.section:
        run_section(args.section, Path(args.scratch))
        return
    deadline = time.monotonic() + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="sdc-gpu-check-"))
    scratch.mkdir(parents=True, exist_ok=True)
    report: Report = {
        "budget_s": args.budget,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    report["nvidia_smi"] = sh(
        [
            "nvidia-smi",
            "--query-gpu=name,compute_mode,mig.mode.current,persistence_mode,"
            "ecc.mode.current,memory.used,memory.total,clocks.sm,power.limit,driver_version",
            "--format=csv",
        ],
        timeout=30,
    )["stdout"]
    chosen = args.sections.split(",")
    for name, limit, _ in SECTIONS:
        if name not in chosen:
            continue
        left = deadline - time.monotonic() - RESERVE_S
        if left < MIN_SECTION_S:
            report[name] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        env = SECTION_ENV.get(name, lambda _: {})(scratch)
        command = [
            sys.executable,
            __file__,
            "--section",
            name,
            "--scratch",
            str(scratch),
            "--out",
            str(out),
        ]
        ran = sh(command, env, min(limit, left))
        path = scratch / f"{name}.json"
        report[name] = json.loads(path.read_text()) if path.exists() else {}
        report[name].update({"rc": ran["rc"], "wall_s": ran["seconds"]})
        if ran["rc"] != 0:
            report[name]["stderr"] = ran["stderr"]
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    report["total_s"] = round(args.budget - (deadline - time.monotonic()), 1)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(summary(report), indent=1, default=str)[:11000])


def summary(report: Report) -> Report:
    """What to read first (the rest is in report.json)."""
    truth = report.get("truth", {})
    burst = report.get("burst", {})
    return {
        "sections": {
            name: {k: report.get(name, {}).get(k) for k in ("rc", "wall_s", "skipped")}
            for name, _, _ in SECTIONS
        },
        "device": truth.get("device"),
        "operands_and_digests": truth.get("operands_and_digests"),
        "wrong": truth.get("wrong"),
        "layout": {
            k: v.get("agrees_with_ptx_tables", v) for k, v in truth.get("layout", {}).items()
        },
        "fp8_exact_up_to_bits": {
            k: v.get("exact_up_to_bits", v)
            for k, v in truth.get("fp8_sweep", {}).items()
            if isinstance(v, dict)
        },
        "digests_one_each": report.get("digests", {}).get("one_digest_each"),
        "burst_warm": {
            k: burst.get("warm", {}).get(k)
            for k in ("rc", "charged_device_s", "pool_peak_mib", "worker_cpu_s", "wall_s")
        },
        "in_process_host": burst.get("in_process_host"),
        "kernels_warpgroup": {
            k: v.get("warpgroup")
            for k, v in report.get("kernels", {}).get("kernels", {}).items()
            if isinstance(v, dict)
        },
        "sfu_dense": report.get("sfu_dense", {}).get("worst"),
        "bounded": [
            (r.get("canary"), r.get("result"))
            for r in report.get("bounded", {}).get("gemm_bounded", [])
        ],
    }


if __name__ == "__main__":
    main()
