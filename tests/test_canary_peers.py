"""Which canary targets vouch for each other: one model and SM count."""

from __future__ import annotations

from gpuwatchd.canary.peers import HOST_CORES, UNKNOWN_MODEL, peer_groups
from gpuwatchd.model import GpuSample

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def samples(*models: str | None) -> dict[int, GpuSample]:
    return {
        index: GpuSample(index=index, up=True, uuid=f"GPU-{index}", name=model)
        for index, model in enumerate(models)
    }


def test_the_gpus_of_a_mixed_node_are_grouped_by_model_and_the_cores_apart() -> None:
    gpus = samples(H100, H100, A100, A100)
    counts = {"GPU-0": 132, "GPU-1": 132, "GPU-2": 108, "GPU-3": 108}
    groups = peer_groups(("gpu:0", "gpu:1", "gpu:2", "gpu:3", "cpu:0"), gpus, counts)
    assert groups == {
        "gpu:0": f"{H100}, 132 SMs",
        "gpu:1": f"{H100}, 132 SMs",
        "gpu:2": f"{A100}, 108 SMs",
        "gpu:3": f"{A100}, 108 SMs",
        "cpu:0": HOST_CORES,
    }


def test_one_model_with_another_sm_count_is_another_group() -> None:
    # An H100 whose backend sees fewer SMs computes the GEMMs with other
    # algorithms: no sibling to an H100 that sees them all.
    gpus = samples(H100, H100, H100)
    groups = peer_groups(
        ("gpu:0", "gpu:1", "gpu:2"), gpus, {"GPU-0": 132, "GPU-1": 132, "GPU-2": 66}
    )
    assert groups["gpu:0"] == groups["gpu:1"] != groups["gpu:2"]


def test_a_model_is_one_group_until_every_gpu_of_it_reported_its_sm_count() -> None:
    # The first bursts come back one GPU at a time: a GPU whose SM count is
    # not known yet is still a peer of its model's others.
    gpus = samples(H100, H100, None)
    groups = peer_groups(("gpu:0", "gpu:1", "gpu:2"), gpus, {"GPU-0": 132, "GPU-2": 132})
    assert groups == {"gpu:0": H100, "gpu:1": H100, "gpu:2": f"{UNKNOWN_MODEL}, 132 SMs"}
