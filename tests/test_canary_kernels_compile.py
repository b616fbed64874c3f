"""Every CUDA kernel of the canaries compiles for the GPUs it is planned on,
with NVIDIA's own compiler where this machine has one (the CUDA toolkit's
nvcc and ptxas; CuPy compiles the same source with NVRTC on the node). No
GPU needed: this checks the C, the inline PTX and its operand types
(`mma.sync` with .e4m3 exists from sm_89 on, .s8 from sm_80), not what the
hardware computes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwatchd.canary import chains, convert, hashing, mma, sfu

NVCC = shutil.which("nvcc")
SOURCES = {
    "chains": chains.CUDA_SOURCE,
    "convert": convert.CUDA_SOURCE,
    "sfu": sfu.CUDA_SOURCE,
    "hashing": hashing.CUDA_SOURCE,
    **{f"mma_{name}": mma.cuda_source(name) for name in mma.MMA_FORMATS},
}
# Ampere, Ada (the first with FP8 mma), Hopper; the FP8 kernel on Ampere is
# its trap path.
ARCHITECTURES = ("sm_80", "sm_89", "sm_90")


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_kernel_compiles_without_a_warning_for_every_architecture(
    name: str, tmp_path: Path
) -> None:
    source = tmp_path / f"{name}.cu"
    source.write_text(SOURCES[name])
    for architecture in ARCHITECTURES:
        done = subprocess.run(
            [
                str(NVCC),
                "-cubin",
                f"-arch={architecture}",
                "-Werror",
                "all-warnings",
                "-o",
                str(tmp_path / f"{name}.{architecture}.cubin"),
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{architecture}: {done.stderr}"
