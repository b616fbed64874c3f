"""Fault codes of what joins the GPUs and the node: NVLink and the NVSwitch
fabric (block 13), InfiniBand (block 14), PCIe and AER (block 15)."""

from __future__ import annotations

from gpuwatchd.faults.code import FaultCode
from gpuwatchd.faults.sources import FABRIC_MANAGER

NVLINK_RESET = "Drain the GPU and reset it; have the link's cabling or baseboard inspected if it "
NVLINK_RESET += "comes back after the reset."


def _nvlink_family(family: str, counters: str, warn_id: str, storm_id: str) -> list[FaultCode]:
    """An NVLink error family's two codes: over its rate in the latest window
    (a warning), and in each of the last `storm_windows` windows (a storm)."""
    evidence = (
        f"The rate of the link's {counters} counters over `checks.nvlink.window`, against "
        f"`checks.nvlink.{family}_storm_rate`; evidence `rate_per_second`, "
        "`threshold_per_second`, `window_seconds`"
    )
    return [
        FaultCode(
            warn_id,
            "nvlink",
            f"nvlink_{family}_errors",
            f"NVLink {family} errors on the link over their rate in the latest window (or, for "
            "the families in `checks.nvlink.warn_on_any`, any at all). A warning.",
            f"{evidence}.",
            "None yet; the storm (the next code) is what quarantines.",
        ),
        FaultCode(
            storm_id,
            "nvlink",
            f"nvlink_{family}_storm",
            f"NVLink {family} errors over their rate in each of the last "
            "`checks.nvlink.storm_windows` windows: critical on the link, confirmed for "
            "`policy.confirm_for`, never definitive.",
            f"{evidence}, `windows`.",
            NVLINK_RESET,
        ),
    ]


NVLINK_AND_FABRIC = (
    FaultCode(
        "GW-1301",
        "nvlink",
        "nvlink_down",
        "An NVLink that was up is down.",
        "NVML's link state (`nvmlDeviceGetNvLinkState`) of a link seen up earlier.",
        NVLINK_RESET,
    ),
    FaultCode(
        "GW-1302",
        "nvlink",
        "nvlink_missing",
        "The GPU has fewer NVLinks up than expected for a whole window (links that never came "
        "up after boot).",
        "The links up against `checks.nvlink.expected_links`, or those ever seen up on the "
        "board (by UUID) and, while the GPU is registered with the fabric, its model's count; "
        "evidence `expected`, `up`, `never_up`.",
        "Check nvidia-fabricmanager and the NVSwitch fabric, then reset the GPU.",
    ),
    FaultCode(
        "GW-1303",
        "nvlink",
        "nvlink_effective_ber",
        "NVLink5: the link's effective bit error rate is over "
        "`checks.nvlink.effective_ber_critical`.",
        "NVML's NVLink5 effective BER field; evidence `ber`, `threshold`.",
        NVLINK_RESET,
    ),
    *_nvlink_family("crc", "CRC flit and CRC data", "GW-1304", "GW-1305"),
    *_nvlink_family("replay", "replay", "GW-1306", "GW-1307"),
    *_nvlink_family("recovery", "recovery and failed recovery", "GW-1308", "GW-1309"),
    *_nvlink_family("ecc", "ECC data", "GW-1310", "GW-1311"),
    *_nvlink_family("effective", "NVLink5 effective error", "GW-1312", "GW-1313"),
    *_nvlink_family("packet", "malformed packet and link integrity", "GW-1314", "GW-1315"),
    FaultCode(
        "GW-1316",
        "fabric",
        "fabric_unhealthy",
        "The NVSwitch fabric calls a route of the GPU unhealthy or its configuration incorrect: "
        "jobs spanning the fabric cannot rely on it. Critical, confirmed, never definitive.",
        "The health mask of `nvmlDeviceGetGpuFabricInfoV` (nvml.h "
        "`NVML_GPU_FABRIC_HEALTH_MASK_*`); evidence `conditions`, `health_mask`.",
        "Check the fabric manager's log and the NVSwitch trays; the fabric manager or an "
        "operator repairs it.",
    ),
    FaultCode(
        "GW-1317",
        "fabric",
        "fabric_degraded",
        "The fabric reports degraded bandwidth or a route or access-timeout recovery for the "
        "GPU: NVLink traffic flows, slower. A warning.",
        "As GW-1316.",
        "Check the fabric manager's log.",
    ),
    FaultCode(
        "GW-1318",
        "fabric",
        "fabric_unregistered",
        "The fabric manager has not registered the GPU for `checks.fabric.registration_timeout`: "
        "NCCL's initialisation hangs on it.",
        "The fabric state of `nvmlDeviceGetGpuFabricInfoV` (not started, in progress); "
        "evidence `state`, `pending_seconds`.",
        "Check that nvidia-fabricmanager runs; restart it or reset the GPU.",
    ),
    FaultCode(
        "GW-1319",
        "fabric",
        "fabric_registration_failed",
        "The fabric manager's registration of the GPU completed with an error.",
        "A completed fabric state with a status other than NVML_SUCCESS; evidence `state`, "
        "`status`.",
        "Restart the fabric manager or reset the GPU.",
    ),
    FaultCode(
        "GW-1320",
        "driver",
        "fabric_manager_not_running",
        "No GPU's fabric registration has started on a node whose GPUs have a fabric: "
        "nvidia-fabricmanager is not running. A warning on the node.",
        "Every fabric-capable GPU's state is not started; evidence `gpus`.",
        "`systemctl enable --now nvidia-fabricmanager` before jobs use NVLink.",
    ),
    FaultCode(
        "GW-1321",
        "sxid",
        "nvswitch_sxid",
        "The NVSwitch driver logged SXids: critical on the node for a `Fatal` one (the switch, "
        "and so the node's GPUs, must be reset), a warning for `Non-fatal` and `Correctable`.",
        "The kernel log's `nvidia-nvswitchN: SXid` lines within `checks.xid.window`; evidence "
        "`sxids`, `switches`, `count`, `fatal`, `window_seconds`.",
        "For a fatal SXid, drain and reboot the node; if it repeats, open a case with the "
        "system's vendor with `nvidia-bug-report.sh`.",
        f"{FABRIC_MANAGER}: the fatal SXids ask for the switch and its GPUs to be reset.",
    ),
)

INFINIBAND_RATIO = "evidence `errors`, the ratio and its thresholds"

INFINIBAND = (
    FaultCode(
        "GW-1401",
        "infiniband",
        "ib_port_down",
        "An expected InfiniBand port is not ACTIVE / LinkUp.",
        "The port's `state` and `phys_state` in sysfs; expected are `checks.infiniband."
        "expected_ports` and the ports the node was seen with ACTIVE.",
        "Check the cable, the transceiver and the switch port (`ibstat`, `iblinkinfo`).",
    ),
    FaultCode(
        "GW-1402",
        "infiniband",
        "ib_port_missing",
        "An expected port is gone from sysfs: the HCA was lost or its driver is not loaded.",
        "The port's directory under `/sys/class/infiniband`.",
        "Check the HCA (`lspci`, the kernel log) and its driver; reseat or replace it.",
    ),
    FaultCode(
        "GW-1403",
        "infiniband",
        "ib_port_rate_degraded",
        "An expected port runs below the highest rate it was seen ACTIVE at within the "
        "history (or `checks.infiniband.min_rate_gbps`). A warning.",
        "The port's `rate` in sysfs.",
        "Check the cable and the switch port; a reseat usually retrains it.",
    ),
    FaultCode(
        "GW-1404",
        "infiniband",
        "ib_link_flapping",
        "The link went down and up within `checks.infiniband.flap_window`: a warning from "
        "`flap_warn_count`, critical from `flap_critical_count`.",
        "`link_downed` and `link_error_recovery` growth, or the port seen leaving ACTIVE; "
        "evidence the counts.",
        "Replace or reseat the cable or transceiver; check the switch port.",
    ),
    FaultCode(
        "GW-1405",
        "infiniband",
        "ib_symbol_errors",
        "Symbol errors at an estimated bit error rate over `checks.infiniband.symbol_ber_warn` "
        "(critical over `symbol_ber_critical`) over `ber_window`.",
        f"`symbol_error` growth per bit the link carried at its line rate; {INFINIBAND_RATIO}.",
        "Clean or replace the cable and transceiver.",
    ),
    FaultCode(
        "GW-1406",
        "infiniband",
        "ib_receive_errors",
        "Received packets with errors at a ratio over `checks.infiniband."
        "receive_packet_error_ratio_warn` (critical over its `_critical`).",
        f"`port_rcv_errors` plus `port_rcv_remote_physical_errors` per packet received; "
        f"{INFINIBAND_RATIO}.",
        "Clean or replace the cable and transceiver.",
    ),
    FaultCode(
        "GW-1407",
        "infiniband",
        "ib_congestion",
        "The port waited for credits more than `checks.infiniband.xmit_wait_warn_ratio` of "
        "the time: fabric congestion, not a fault of the node. A warning.",
        "`port_xmit_wait` as a share of `congestion_window`; evidence `xmit_wait_ticks`.",
        "Look at the fabric's routing and its busiest links.",
    ),
    FaultCode(
        "GW-1408",
        "infiniband",
        "ib_xmit_discards",
        "The port discarded outbound packets. A warning.",
        "`port_xmit_discards` growth; evidence `discards`.",
        "Look at the fabric's congestion and the switch port.",
    ),
    FaultCode(
        "GW-1409",
        "infiniband",
        "ib_counter_saturated",
        "IBTA counters stuck at their maximum count nothing more: a warning when one filled up "
        "while watched, severity ok when it was already full.",
        "The counters at the IBTA maximum of their width.",
        "Clear the port's counters (`perfquery -C <device> -P <port> -R`).",
    ),
)

PCIE_AND_AER = (
    FaultCode(
        "GW-1501",
        "pcie",
        "pcie_downtrained",
        "A busy GPU's PCIe link runs below the generation or width it and its slot allow: a "
        "warning, critical once it held for `checks.pcie.critical_windows` busy windows; "
        "never definitive (a reset retrains it).",
        "NVML's current and maximum link generation and width while the GPU is busy; "
        "evidence `generation`, `max_generation`, `width`, `max_width`.",
        "Reseat the GPU or its riser; check the slot and the BIOS's PCIe settings.",
    ),
    FaultCode(
        "GW-1502",
        "pcie",
        "pcie_replay_storm",
        "The GPU's PCIe link replays more than a bit error rate of "
        "`checks.pcie.replay_bit_error_rate` gives at its line rate. A warning.",
        "NVML's PCIe replay counter over `checks.pcie.replay_window`; evidence "
        "`replays_per_minute`, `allowed`.",
        "Reseat the GPU or its riser; inspect the slot.",
        "DCGM's PCIe health watch allows the same replay rate (DcgmHealthWatch.cpp, "
        "`GetExpectedPcieReplayRate`).",
    ),
    FaultCode(
        "GW-1503",
        "aer",
        "aer_fatal_errors",
        "A GPU's or an HCA's PCIe function reported fatal uncorrectable errors: the link was "
        "unreliable and the kernel reset it. Critical (a warning on the node when the function "
        "is not named); never definitive.",
        "The function's AER counters in sysfs (`aer_dev_fatal`); evidence `address`, "
        "`fatal_errors`.",
        "Reseat or replace the device, its riser or its slot if it repeats.",
    ),
    FaultCode(
        "GW-1504",
        "aer",
        "aer_nonfatal_errors",
        "Non-fatal uncorrectable PCIe errors: a transaction was lost (a completion timeout, an "
        "unsupported request, a poisoned TLP). A warning.",
        "`aer_dev_nonfatal`; evidence `address`, `nonfatal_errors`.",
        "Watch it; inspect the device if it repeats.",
    ),
    FaultCode(
        "GW-1505",
        "aer",
        "aer_correctable_storm",
        "Correctable PCIe errors faster than a bit error rate of "
        "`checks.aer.correctable_bit_error_rate` gives at the link's rate. A warning.",
        "`aer_dev_correctable` over `checks.aer.correctable_window`; evidence "
        "`correctable_per_minute`, `allowed`.",
        "Reseat the device or its riser; inspect the slot.",
    ),
)
