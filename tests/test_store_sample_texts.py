"""The JSON the store keeps of each poll's last samples: made in part from
what the last poll wrote, it must be, byte for byte, what encoding the
sample afresh writes, whatever changed and however little."""

from __future__ import annotations

import json
from dataclasses import replace

from gpu_history import gpu, link

from gpuwatchd.model import GpuSample, PcieFunctionSample
from gpuwatchd.store.samples import SampleTexts


def _written_after(texts: SampleTexts, sample: object) -> str:
    if isinstance(sample, GpuSample):
        return texts.gpu(sample, "GPU-0000")
    assert isinstance(sample, PcieFunctionSample)
    return texts.pcie(sample)


def _assert_each_written_as_afresh(samples: list[object]) -> None:
    kept = SampleTexts()
    for sample in samples:
        text = _written_after(kept, sample)
        assert text == _written_after(SampleTexts(), sample)
        # As json.dumps writes the dict it reads back as.
        assert text == json.dumps(json.loads(text))


def test_a_gpu_sample_changed_to_equal_values_of_another_kind_is_written_as_it_is_now() -> None:
    first = gpu(
        0,
        name="NVIDIA H100 80GB HBM3",
        temperature_gpu_celsius=61.0,
        power_watts=0.0,
        clocks_event_reasons=1,
        throttle_seconds={"power": 0.5, "thermal": 0.0},
        ecc_errors={("corrected", "volatile"): 0, ("corrected", "aggregate"): 9},
        nvlinks=(link(0, 0, crc_flit=5), link(0, 1)),
        xid_counts={79: 1},
    )
    _assert_each_written_as_afresh(
        [
            first,
            # Equal floats, new objects; a name beyond ASCII.
            replace(first, temperature_gpu_celsius=61.0 + 0.0, name="H100 \u00e9\u4e2d"),
            # -0.0 equals 0.0 but is written otherwise; 1.0 and True equal 1.
            replace(first, power_watts=-0.0, clocks_event_reasons=1.0),
            replace(first, power_watts=float("nan"), clocks_event_reasons=True),
            replace(first, power_watts=float("inf"), energy_joules=float("-inf")),
            replace(first, power_watts=2**70, clocks_event_reasons=None),
            # The same keys in another order, and an equal mapping anew.
            replace(first, throttle_seconds={"thermal": 0.0, "power": 0.5}),
            replace(first, throttle_seconds={"thermal": 0.0, "power": 0.5}),
            replace(first, ecc_errors={("corrected", "aggregate"): 9}),
            replace(first, nvlinks=(link(0, 0, crc_flit=6),), xid_counts={}),
            first,
        ]
    )


def test_a_pcie_function_is_written_as_it_is_now_poll_after_poll() -> None:
    function = PcieFunctionSample("0000:18:00.0", "gpu", aer_errors={"fatal": 0}, link_width=16)
    _assert_each_written_as_afresh(
        [
            function,
            function,
            replace(function, aer_errors={"fatal": False}),
            replace(function, aer_errors={"fatal": 0}, link_width=8),
            replace(function, name="mlx5_\u00e9"),
        ]
    )
