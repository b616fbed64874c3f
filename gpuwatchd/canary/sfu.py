"""The special-function units (MUFU): the fast transcendentals, judged
against the error bounds NVIDIA documents for them.

Each thread evaluates six functions the CUDA C++ Programming Guide lists
with their accuracy ("Intrinsic Functions" and "Standard Functions" tables
of the Mathematical Functions appendix), each of which compiles to the SFU
(MUFU.SIN, MUFU.COS, MUFU.LG2, MUFU.EX2, MUFU.RSQ, MUFU.RCP) with at most a
multiply around it:

    __sinf(x), x in [-pi, pi]     absolute error <= 2^-21.41
    __cosf(x), x in [-pi, pi]     absolute error <= 2^-21.19
    __log2f(y), y in [0.5, 2]     absolute error <= 2^-22
    __expf(z)                     2 + floor(|1.173 z|) ulp
    rsqrtf(y)                     2 ulp
    __fdividef(x, y)              2 ulp for |y| in [2^-126, 2^126]

Unlike a conversion, a transcendental has no single right answer: the
hardware's approximation is only bounded. So a result is wrong only when it
is outside `MARGIN` times its documented bound of the exact value (float64
on two host cores): a healthy GPU of any generation can never be condemned
by the rounding of its tables, and a fault that moves a result by more than
that (an exponent bit, the high mantissa bits) is a mismatch like any
other. What the bounds cannot see, a flip in the last dozen bits of a
result, this canary does not claim to catch (docs/sdc.md).

Inputs stay clear of denormals (the fast intrinsics flush them) and of the
ends of the documented ranges. `sfu` is the CPU backend's kernel: the same
functions in float32 NumPy, within twice the documented bounds (NumPy's
vectorised expf errs by up to 2.2 ulp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.chains import SMID_SOURCE

FUNCTIONS = ("sin", "cos", "log2", "exp", "rsqrt", "divide")
WORDS_PER_THREAD = len(FUNCTIONS)
# Each documented bound is widened this many times before a result counts
# as wrong: 3 bits of headroom against a bound measured on one generation.
MARGIN = 8.0
# x for sin and cos: magnitudes in [2^-8, 3.1]; z for exp: [-8, 8].
ANGLE = (2.0**-8, 3.1)
EXP_RANGE = 8.0
FLOAT32_ULP_BITS = 23
# The documented bounds: absolute for sin, cos and log2; in ulp for rsqrt and
# divide (exp's grows with its argument: 2 + floor(|1.173 z|)).
ABSOLUTE_BOUNDS = (2.0**-21.41, 2.0**-21.19, 2.0**-22)
ULP_BOUNDS = (2.0, 2.0)


@dataclass(frozen=True, eq=False)
class SfuInputs:
    angle: NDArray[np.float32]  # (threads,) in +-[2^-8, 3.1]
    scale: NDArray[np.float32]  # (threads,) in [0.5, 2)
    power: NDArray[np.float32]  # (threads,) in [-8, 8]


def sfu_inputs(threads: int, seed: int) -> SfuInputs:
    rng = np.random.default_rng([11, threads, seed])
    magnitude = np.exp2(rng.uniform(math.log2(ANGLE[0]), math.log2(ANGLE[1]), threads))
    angle = (rng.choice(np.array([-1.0, 1.0]), threads) * magnitude).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, threads).astype(np.float32)
    power = rng.uniform(-EXP_RANGE, EXP_RANGE, threads).astype(np.float32)
    return SfuInputs(angle, scale, power)


def sfu(inputs: SfuInputs) -> NDArray[np.float32]:
    """The six functions in float32 NumPy: (threads, 6)."""
    x, y, z = inputs.angle, inputs.scale, inputs.power
    one = np.float32(1)
    return np.stack(
        [np.sin(x), np.cos(x), np.log2(y), np.exp(z), one / np.sqrt(y), x / y], axis=1
    ).astype(np.float32)


def sfu_reference(inputs: SfuInputs) -> NDArray[np.float64]:
    """The exact values, in float64: (threads, 6)."""
    x, y, z = (v.astype(np.float64) for v in (inputs.angle, inputs.scale, inputs.power))
    return np.stack([np.sin(x), np.cos(x), np.log2(y), np.exp(z), 1 / np.sqrt(y), x / y], axis=1)


def _ulp(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """One float32 ulp at each (normal) value."""
    exponent = np.floor(np.log2(np.abs(values)))
    ulp: NDArray[np.float64] = np.exp2(exponent - FLOAT32_ULP_BITS)
    return ulp


def tolerance(inputs: SfuInputs, exact: NDArray[np.float64]) -> NDArray[np.float64]:
    """MARGIN times each result's documented bound: (threads, 6)."""
    z = inputs.power.astype(np.float64)
    absolute = np.broadcast_to(ABSOLUTE_BOUNDS, (z.size, len(ABSOLUTE_BOUNDS)))
    ulps = np.stack([2 + np.floor(np.abs(1.173 * z)), *(np.full_like(z, u) for u in ULP_BOUNDS)])
    relative = ulps.T * _ulp(exact[:, len(ABSOLUTE_BOUNDS) :])
    return MARGIN * np.concatenate([absolute, relative], axis=1)


def outside(
    values: NDArray[np.float32], exact: NDArray[np.float64], inputs: SfuInputs
) -> NDArray[np.bool_]:
    """Which results are farther from the exact value than their bound allows
    (NaN and infinity always are)."""
    error = np.abs(values.astype(np.float64) - exact)
    return ~(error <= tolerance(inputs, exact))


CUDA_SOURCE = (
    SMID_SOURCE
    + """
extern "C" __global__ void sfu(
    const float* angle, const float* scale, const float* power, int threads,
    float* out, unsigned int* sm_start, unsigned int* sm_end) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  sm_start[i] = smid();
  float x = angle[i], y = scale[i], z = power[i];
  out[6 * i] = __sinf(x);
  out[6 * i + 1] = __cosf(x);
  out[6 * i + 2] = __log2f(y);
  out[6 * i + 3] = __expf(z);
  out[6 * i + 4] = rsqrtf(y);
  out[6 * i + 5] = __fdividef(x, y);
  sm_end[i] = smid();
}
"""
)
