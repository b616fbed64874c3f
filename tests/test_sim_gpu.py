"""The simulated GPUs and the fake libnvidia-ml that serves them to nvidia-ml-py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from nvml_support import A100, B200, H100, V100, scenario

from gpuwatchd.sim.fake_nvml import R580_DRIVER_VERSION, FakeNvml
from gpuwatchd.sim.gpu import SPECS, SimulatedGpus, spec_for
from gpuwatchd.sim.scenario import parse

START = 1_767_225_600.0


def hardware(faults: str = "[]", **shape: Any) -> SimulatedGpus:
    return SimulatedGpus(scenario(faults, **shape), START)


@pytest.fixture
def nvml() -> Iterator[FakeNvml]:
    """An initialised fake NVML on a healthy two-GPU H100 node."""
    with FakeNvml(hardware()) as fake:
        pynvml.nvmlInit()
        yield fake
        pynvml.nvmlShutdown()


def field(handle: Any, field_id: int, scope: int = 0) -> Any:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [(field_id, scope)])
    return value


# -- the hardware model ---------------------------------------------------------


def test_same_seed_same_node_whatever_the_advance_cadence() -> None:
    stepped, jumped = hardware(gpus=4), hardware(gpus=4)
    for second in range(0, 601, 7):
        stepped.advance(START + second)
    jumped.advance(START + 602)
    stepped.advance(START + 602)
    assert [stepped.state(i) for i in range(4)] == [jumped.state(i) for i in range(4)]
    assert [gpu.uuid for gpu in stepped.gpus] == [gpu.uuid for gpu in jumped.gpus]


def test_another_seed_gives_another_node() -> None:
    one, other = hardware(seed=1), hardware(seed=2)
    one.advance(START + 300)
    other.advance(START + 300)
    assert one.gpus[0].uuid != other.gpus[0].uuid
    assert one.state(0) != other.state(0)


def test_background_evolves_slowly_and_counters_never_go_back() -> None:
    node = hardware(gpus=1)
    previous = None
    for second in range(0, 7200, 10):
        node.advance(START + second)
        state = node.state(0)
        if previous is not None:
            assert abs(state.temperature_celsius - previous.temperature_celsius) <= 2
            for key, count in state.ecc_errors.items():
                assert count >= previous.ecc_errors[key]
            assert state.violation_ns["power"] >= previous.violation_ns["power"]
        previous = state


def test_h100_background_matches_a_busy_training_node() -> None:
    node = hardware(gpus=8)
    node.advance(START + 1234)
    spec = node.gpus[0].spec
    assert (spec.nvlinks, spec.slowdown_celsius, spec.shutdown_celsius) == (18, 89, 92)
    assert (spec.sm_max_mhz, spec.memory_mhz, spec.power_limit_watts) == (1980, 2619, 700)
    for index in range(8):
        state = node.state(index)
        assert 55 <= state.temperature_celsius <= 72
        assert state.temperature_celsius < state.memory_temperature_celsius
        assert 85 <= state.utilization_gpu_percent <= 100
        assert 500_000 <= state.power_milliwatts <= 690_000
        assert state.sm_clock_mhz in (1950, 1965, 1980) and state.memory_clock_mhz == 2619
        assert state.clocks_event_reasons == 0
        assert len(state.links) == 18 and all(link.active for link in state.links)
    assert len({gpu.pci_bus_id for gpu in node.gpus}) == 8


@pytest.mark.parametrize(
    ("model", "links", "architecture"),
    [(A100, 12, "ampere"), (B200, 18, "blackwell"), (V100, 6, "volta")],
)
def test_other_models_have_their_generation(model: str, links: int, architecture: str) -> None:
    node = hardware(model=model)
    assert node.gpus[0].spec.architecture == architecture
    assert node.gpus[0].nvlinks == links  # the node's 18 links, capped at what the GPU has
    assert len(node.state(0).links) == links


def test_unknown_model_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"known: .*NVIDIA A100-SXM4-80GB"):
        spec_for("NVIDIA GeForce RTX 4090")
    assert set(SPECS) >= {H100, A100, B200, V100}


def test_a_node_that_mixes_models_serves_each_gpu_as_its_own_model() -> None:
    mixed = parse(f'node: {{models: ["{H100}", "{A100}", "{V100}"]}}\n')
    node = SimulatedGpus(mixed, START)
    node.advance(START + 60)
    with FakeNvml(node):
        pynvml.nvmlInit()
        for index, (model, links, max_mhz) in enumerate(
            [(H100, 18, 1980), (A100, 12, 1410), (V100, 6, 1530)]
        ):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            assert pynvml.nvmlDeviceGetName(handle) == model
            assert pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) == max_mhz
            assert len(node.state(index).links) == links
        pynvml.nvmlShutdown()
    assert [gpu.spec.sm_count for gpu in node.gpus] == [132, 108, 80]


def test_an_unknown_model_among_models_is_refused_with_the_known_ones() -> None:
    mixed = parse(f'node: {{models: ["{H100}", "NVIDIA GeForce RTX 4090"]}}\n')
    with pytest.raises(ValueError, match=r"'NVIDIA GeForce RTX 4090' \(known: .*NVIDIA B200"):
        SimulatedGpus(mixed, START)


def test_fault_on_a_link_the_gpu_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="12 NVLinks, no link 15"):
        hardware("[{at: 1s, kind: nvlink_down, gpu: 0, link: 15}]", model=A100)


def test_xids_queue_only_once_the_model_passes_their_time() -> None:
    node = hardware(
        "[{at: 0s, kind: xid, gpu: 0, code: 13}, {at: 30s, kind: xid, gpu: 1, code: 31}]"
    )
    assert node.xid_count == 0
    node.advance(START)
    assert [(r.gpu, r.code) for r in node.xids_from(0)] == [(0, 13)]
    node.advance(START + 29.9)
    assert node.xid_count == 1
    node.advance(START + 30)
    node.advance(START + 60)
    assert [(r.gpu, r.code, r.time) for r in node.xids_from(1)] == [(1, 31, 30.0)]


def test_gpu_lost_raises_xid_79_just_before_falling_off_the_bus() -> None:
    node = hardware("[{at: 10s, kind: gpu_lost, gpu: 1, for: 20s}]")
    node.advance(START + 9.9995)
    assert [r.code for r in node.xids_from(0)] == [79]
    assert not node.state(1).lost
    node.advance(START + 10)
    assert node.state(1).lost and not node.state(0).lost
    node.advance(START + 30)
    assert not node.state(1).lost


def test_canary_and_infiniband_faults_leave_the_gpus_alone() -> None:
    faults = """[{at: 1s, kind: sdc, gpu: 0},
                 {at: 1s, kind: ib_port_down, hca: mlx5_0, port: 1}]"""
    touched, calm = hardware(faults), hardware()
    touched.advance(START + 60)
    calm.advance(START + 60)
    assert touched.state(0) == calm.state(0) and touched.xid_count == 0


def test_thermal_fault_ramps_up_holds_and_cools() -> None:
    node = hardware("[{at: 10s, kind: thermal_throttle, gpu: 0, for: 60s}]")
    node.advance(START + 20)
    halfway = node.state(0)
    assert halfway.clocks_event_reasons == 0 and halfway.temperature_celsius < 89
    node.advance(START + 40)
    assert node.state(0).temperature_celsius == 91
    node.advance(START + 100)
    assert node.state(0).temperature_celsius <= 72
    assert node.state(0).violation_ns["thermal"] == 40 * 10**9


def test_idle_gpus_drop_to_their_idle_clock_and_power_while_the_others_stay_busy() -> None:
    faults = "[{at: 60s, kind: gpu_idle, gpu: 1, for: 10m}, {at: 0s, kind: gpu_idle, gpu: 2}]"
    node = hardware(faults, gpus=4)
    node.advance(START + 120)
    states = [node.state(i) for i in range(4)]
    for state in states[1:3]:
        assert (state.utilization_gpu_percent, state.utilization_memory_percent) == (0, 0)
        assert (state.sm_clock_mhz, state.power_milliwatts) == (345, 70_000)
        assert state.clocks_event_reasons == 0x1  # NVML's GpuIdle
    for state in (states[0], states[3]):
        assert state.utilization_gpu_percent >= 85 and state.sm_clock_mhz >= 1950
        assert state.clocks_event_reasons == 0
    # An idle GPU does not brush its power limit; it is busy again once the fault ends.
    node.advance(START + 900)
    assert node.state(2).violation_ns["power"] == 0
    assert node.state(1).utilization_gpu_percent >= 85


def test_an_idle_a100_idles_at_its_own_clock() -> None:
    node = hardware("[{at: 0s, kind: gpu_idle, gpu: 0}]", model=A100)
    node.advance(START + 30)
    assert node.state(0).sm_clock_mhz == 210


# -- the fake library under nvidia-ml-py --------------------------------------------


def test_hopper_answers_the_error_counter_and_zero_from_the_legacy_fields(
    nvml: FakeNvml,
) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    crc = pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 17, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
    assert crc == 0
    legacy = field(handle, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0)
    assert (legacy.nvmlReturn, legacy.value.ullVal) == (pynvml.NVML_SUCCESS, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 18, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)


def test_ampere_answers_per_link_fields_and_the_error_counter() -> None:
    node = hardware("[{at: 0s, kind: nvlink_crc_storm, gpu: 0, link: 4, rate: 10/s}]", model=A100)
    node.advance(START + 100)
    with FakeNvml(node):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        lane = field(handle, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L4)
        counter = pynvml.nvmlDeviceGetNvLinkErrorCounter(
            handle, 4, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
        )
        assert lane.value.ullVal == counter >= 1000
        scoped = field(handle, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 4)
        assert scoped.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
        pynvml.nvmlShutdown()


def test_blackwell_answers_only_the_nvlink_count_fields() -> None:
    with FakeNvml(hardware(model=B200)):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        recovery = field(handle, pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, 3)
        assert recovery.nvmlReturn == pynvml.NVML_SUCCESS
        for refused in (
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
            pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
        ):
            assert field(handle, refused, 3).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
        pynvml.nvmlShutdown()


def test_r580_driver_still_answers_violation_status() -> None:
    # nvml.h 13.0: DEPRECATED(13.0) is a no-op there; removal is for CUDA 14.0.
    with FakeNvml(
        hardware("[{at: 0s, kind: power_cap, gpu: 0}]"), driver_version=R580_DRIVER_VERSION
    ) as fake:
        fake.model.advance(START + 30)
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlSystemGetDriverVersion() == R580_DRIVER_VERSION
        violation = pynvml.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_POWER)
        power = field(handle, pynvml.NVML_FI_DEV_PERF_POLICY_POWER)
        assert power.nvmlReturn == pynvml.NVML_SUCCESS
        assert violation.violationTime == power.value.ullVal >= 30e9
        pynvml.nvmlShutdown()


def test_function_the_fake_does_not_export_is_function_not_found(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetFanSpeed(handle)
    nvml.remove_function("nvmlDeviceGetPowerUsage")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    nvml.restore_function("nvmlDeviceGetPowerUsage")
    assert pynvml.nvmlDeviceGetPowerUsage(handle) > 0


def test_failure_injected_for_one_gpu_only(nvml: FakeNvml) -> None:
    nvml.fail(pynvml.NVML_ERROR_NO_PERMISSION, "nvmlDeviceGetClockInfo", gpu=1)
    assert pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(1), pynvml.NVML_CLOCK_SM)


def test_calls_before_init_are_uninitialized() -> None:
    with FakeNvml(hardware()), pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_lost_gpu_answers_gpu_is_lost_to_every_call() -> None:
    node = hardware("[{at: 5s, kind: gpu_lost, gpu: 0}]")
    with FakeNvml(node):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        node.advance(START + 10)
        for call in (pynvml.nvmlDeviceGetName, pynvml.nvmlDeviceGetPowerUsage):
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                call(handle)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlShutdown()


def test_event_set_wait_with_zero_timeout_returns_at_once(nvml: FakeNvml) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(
        pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    pynvml.nvmlEventSetFree(event_set)


def test_event_set_delivers_xids_of_registered_gpus_only() -> None:
    node = hardware(
        "[{at: 5s, kind: xid, gpu: 0, code: 13}, {at: 6s, kind: xid, gpu: 1, code: 31}]"
    )
    with FakeNvml(node):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert (
            pynvml.nvmlDeviceGetSupportedEventTypes(handle) & pynvml.nvmlEventTypeXidCriticalError
        )
        event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        node.advance(START + 10)
        data = pynvml.nvmlEventSetWait_v2(event_set, 0)
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 31)
        assert pynvml.nvmlDeviceGetUUID(data.device) == node.gpus[1].uuid
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(event_set, 0)
        pynvml.nvmlEventSetFree(event_set)
        pynvml.nvmlShutdown()


def test_swapped_model_starts_its_event_sets_at_its_own_present() -> None:
    first = hardware("[{at: 1s, kind: xid, gpu: 0, code: 13}]")
    second = hardware(
        "[{at: 1s, kind: xid, gpu: 0, code: 31}, {at: 9s, kind: xid, gpu: 0, code: 43}]"
    )
    with FakeNvml(first) as fake:
        pynvml.nvmlInit()
        event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(
            pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set
        )
        second.advance(START + 5)
        fake.model = second
        second.advance(START + 10)
        assert pynvml.nvmlEventSetWait_v2(event_set, 0).eventData == 43
        pynvml.nvmlShutdown()


def test_install_and_uninstall_restore_the_previous_library() -> None:
    previous = pynvml.nvmlLib
    fake = FakeNvml(hardware())
    fake.install()
    assert pynvml.nvmlLib is fake.library
    fake.uninstall()
    assert pynvml.nvmlLib is previous


def test_structs_are_filled_as_the_binding_reads_them(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    simulated = nvml.model.gpus[1]
    pci = pynvml.nvmlDeviceGetPciInfo_v3(handle)
    assert pci.busId == simulated.pci_bus_id and pci.bus == int(simulated.pci_bus_id[9:11], 16)
    assert pci.pciDeviceId == simulated.spec.pci_device_id
    utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
    assert utilization.gpu == nvml.model.state(1).utilization_gpu_percent
    violation = pynvml.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_THERMAL)
    assert violation.violationTime == 0 and violation.referenceTime == int(START * 1e6)
    assert (
        pynvml.nvmlDeviceGetTemperatureThreshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
        == 95
    )
    assert (
        pynvml.nvmlDeviceGetClock(
            handle, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT
        )
        == 1980
    )
    assert pynvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    assert "Not Supported" in str(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_DEPRECATED)) == "Deprecated"
