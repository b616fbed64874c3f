"""`canary`: exit status 0 all pass, 1 a wrong answer, 2 could not run."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner

from gpuwatchd.canary.spec import RANDOM_GEMM_DTYPES
from gpuwatchd.cli.canary import canary


def scenario(
    tmp_path: Path, faults: str = "", gpus: int = 3, model: str = "NVIDIA H100 80GB HBM3"
) -> str:
    path = tmp_path / "node.yaml"
    node = f'node: {{gpus: {gpus}, model: "{model}"}}\nseed: 4\n'
    path.write_text(f"{node}faults:\n{faults or '  []'}\n")
    return str(path)


SDC_ON_GPU_1 = "  - {at: 30s, kind: sdc, gpu: 1, mode: lane}\n"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(canary, list(args))
    return result.exit_code, result.output


def test_a_healthy_simulated_node_passes(tmp_path: Path) -> None:
    code, output = run("--simulate", scenario(tmp_path, gpus=2))
    assert code == 0, output
    assert output.splitlines()[-1] == "all 40 canaries passed"
    assert "gpu 1  gemm_exact_fp16" in output


def test_a_simulated_v100_runs_no_tensor_core_tile(tmp_path: Path) -> None:
    code, output = run("--simulate", scenario(tmp_path, gpus=1, model="Tesla V100-SXM2-32GB"))
    assert code == 0, output
    assert output.splitlines()[-1] == "all 18 canaries passed"
    assert "mma_" not in output


def test_a_node_that_mixes_models_runs_each_gpu_as_its_model(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text('node: {models: ["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"]}\n')
    code, output = run("--simulate", str(path), "--json")
    assert code == 0, output
    results = json.loads(output)
    assert {r["gpu"]: r["sm_count"] for r in results} == {0: 132, 1: 80}
    tiles = {r["gpu"] for r in results if r["canary"].startswith("mma_")}
    assert tiles == {0}  # a V100 has no INT8 or FP8 tensor cores
    digests = {r["gpu"]: r["environment"] for r in results if r["canary"] == "gemm_random_fp32"}
    assert digests[0].startswith("NVIDIA H100") and digests[1].startswith("Tesla V100")


def test_a_gpu_with_silent_data_corruption_fails_the_run(tmp_path: Path) -> None:
    code, output = run("--simulate", scenario(tmp_path, SDC_ON_GPU_1), "--json")
    assert code == 1, output
    results = json.loads(output)
    assert {(r["gpu"], r["result"]) for r in results if r["result"] != "pass"} == {(1, "mismatch")}
    for item in results:
        assert {"gpu", "canary", "dtype", "result", "seed", "shape", "duration_seconds"} <= set(
            item
        )
        assert {"mismatch_count", "first_mismatch_index", "bit_histogram"} <= set(item)
    chain = next(r for r in results if r["gpu"] == 1 and r["canary"] == "int_chain_u32")
    assert chain["mismatch_lanes"] == [5] and chain["mismatch_count"] > 0
    assert sum(chain["bit_histogram"]) > chain["mismatch_count"]
    gemm = next(r for r in results if r["gpu"] == 1 and r["canary"] == "gemm_random_fp32")
    assert gemm["result"] == "mismatch"  # the other two GPUs outvote it
    assert len({r["gpu"] for r in results}) == 3


def test_one_gpu_can_be_picked(tmp_path: Path) -> None:
    code, output = run("--simulate", scenario(tmp_path, SDC_ON_GPU_1), "--gpu", "2", "--json")
    assert code == 0, output
    assert {r["gpu"] for r in json.loads(output)} == {2}


def test_a_device_error_means_the_suite_could_not_run(tmp_path: Path) -> None:
    faults = "  - {at: 0s, kind: sdc, gpu: 0, mode: error}\n"
    code, output = run("--simulate", scenario(tmp_path, faults, gpus=2), "--json")
    assert code == 2
    errors = [r for r in json.loads(output) if r["result"] == "error"]
    assert [r["gpu"] for r in errors] == [0] and "illegal memory access" in errors[0]["message"]


def test_a_mismatch_outranks_an_error(tmp_path: Path) -> None:
    faults = "  - {at: 0s, kind: sdc, gpu: 0, mode: error}\n" + SDC_ON_GPU_1
    code, output = run("--simulate", scenario(tmp_path, faults))
    assert code == 1
    # GPU 1's burst mismatched, GPU 0's stopped at its first canary's error.
    assert output.splitlines()[-1] == "of 41 canaries, 12 mismatched, 1 could not run"


def test_what_cannot_run_exits_2(tmp_path: Path) -> None:
    node = scenario(tmp_path)
    assert run("--simulate", str(tmp_path / "missing.yaml"))[0] == 2
    assert run("--simulate", node, "--gpu", "7")[0] == 2
    assert run("--simulate", node, "--gpu", "one")[0] == 2
    assert run("--simulate", node, "--backend", "cuda")[0] == 2
    bad_mode = scenario(tmp_path, "  - {at: 0s, kind: sdc, gpu: 0, mode: cosmic}\n")
    code, output = run("--simulate", bad_mode)
    assert code == 2 and "unknown mode 'cosmic'" in output
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text('node: {models: ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"]}\n')
    code, output = run("--simulate", str(unknown))
    assert code == 2 and "'NVIDIA GeForce RTX 4090' (known: " in output


def test_long_runs_sustained_gemms_in_every_format(tmp_path: Path) -> None:
    code, output = run("--simulate", scenario(tmp_path, gpus=2), "--long", "0s", "--json")
    assert code == 0, output
    results = json.loads(output)
    assert {r["canary"] for r in results} == {f"gemm_burn_{d}" for d in RANDOM_GEMM_DTYPES}
    assert {r["gpu"] for r in results} == {0, 1} and all(r["result"] == "pass" for r in results)


def test_long_stops_at_a_wrong_answer(tmp_path: Path) -> None:
    # A lane fault spoils every product alike: the sampled fp64 check of
    # the first one sees it, in the first round.
    code, output = run("--simulate", scenario(tmp_path, SDC_ON_GPU_1), "--gpu", "1", "--long", "1h")
    assert code == 1, output
    assert "gemm_burn_fp32" in output and "mismatch" in output


def test_long_needs_a_duration_and_a_gpu(tmp_path: Path) -> None:
    assert run("--simulate", scenario(tmp_path), "--long", "forever")[0] == 2


def test_a_built_in_scenario_runs_by_name() -> None:
    code, output = run("--simulate", "calm", "--gpu", "0")
    assert code == 0, output


def test_the_command_joins_a_click_group_as_canary(tmp_path: Path) -> None:
    @click.group()
    def main() -> None:
        """The lead's group."""

    main.add_command(canary)
    result = CliRunner().invoke(main, ["canary", "--simulate", scenario(tmp_path, gpus=1)])
    assert result.exit_code == 0, result.output
    assert canary.name == "canary"
