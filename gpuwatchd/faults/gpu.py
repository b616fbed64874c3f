"""Fault codes of the GPU itself: thermal and clocks (block 10), memory
(block 11) and the driver's XIDs (block 12)."""

from __future__ import annotations

from gpuwatchd.faults.code import FaultCode
from gpuwatchd.faults.sources import MEMORY_GUIDE, PAGE_RETIREMENT, XID_CATALOG

THERMAL_AND_CLOCKS = (
    FaultCode(
        "GW-1001",
        "thermal",
        "thermal_throttling",
        "The GPU spent `checks.thermal.thermal_warn_ratio` (a tenth) of the window or more "
        "thermally throttled: it runs slower than it should.",
        "NVML's cumulative thermal violation time over `checks.thermal.window`; evidence "
        "`throttle_ratio`, `window_seconds`.",
        "Check the node's cooling (fans, airflow, inlet temperature) and the board's heat sink. "
        "A warning: nothing is quarantined for it.",
    ),
    FaultCode(
        "GW-1002",
        "thermal",
        "hw_slowdown",
        "The hardware slowed the GPU (HW slowdown, HW thermal slowdown or the power brake) for "
        "`checks.thermal.hw_slowdown_ratio` of the window or more while it was not cool: clocks "
        "cut by half or more.",
        "The driver's HW thermal and power-brake slowdown counters (R575 on) or the share of "
        "samples with a HW slowdown reason bit (nvml.h 0x8, 0x40, 0x80); evidence "
        "`window_ratio`, `sample_ratio`, `reasons`.",
        "Check cooling and the node's power supply; have the board inspected if it recurs.",
    ),
    FaultCode(
        "GW-1003",
        "thermal",
        "hw_slowdown_while_cool",
        "The hardware slowed a GPU that is cool (GPU and HBM well below their slowdown "
        "thresholds): a board, power or sensor fault. Critical, confirmed for "
        "`policy.confirm_for`.",
        "As GW-1002, with the GPU and HBM temperatures `checks.thermal.cool_margin_celsius` "
        "below their limits over the window.",
        "Drain the node and have the board, its power delivery and its sensors inspected.",
    ),
    FaultCode(
        "GW-1004",
        "thermal",
        "gpu_temperature_high",
        "The GPU is within `checks.thermal.gpu_margin_warn_celsius` of the temperature at which "
        "the driver slows it down.",
        "NVML's GPU temperature and its slowdown threshold; evidence `temperature_celsius`, "
        "`margin_celsius`.",
        "Check the node's cooling before the GPU throttles. A warning.",
    ),
    FaultCode(
        "GW-1005",
        "thermal",
        "hbm_temperature_high",
        "The GPU's memory (HBM) is within `checks.thermal.hbm_margin_warn_celsius` of its "
        "limit (`hbm_max_celsius` where the driver gives none).",
        "NVML's memory temperature; evidence `temperature_celsius`, `margin_celsius`.",
        "Check the node's cooling. A warning.",
    ),
    FaultCode(
        "GW-1006",
        "clocks",
        "clock_drift",
        "A busy GPU runs its SM clock below its peers of the same model with no clocks-event "
        "reason to explain it: the straggler of a synchronous job. A warning; critical once it "
        "held for `checks.clocks.critical_windows` windows, each with a second reference.",
        "SM clocks, utilisation and clocks-event reasons of the node's busy GPUs over "
        "`checks.clocks.window`, against the median of their peers (or the peers' last busy "
        "clocks); the ratio is `gpuwatchd_gpu_clock_drift_ratio`.",
        "Drain the node and have the board inspected when critical; a warning alone needs "
        "no action.",
    ),
)

MEMORY = (
    FaultCode(
        "GW-1101",
        "memory",
        "ecc_uncorrectable",
        "The GPU's memory had an uncorrectable ECC error: the GPU is drained at once and needs "
        "a reset, which applies the row remap. Released once quiet for `policy.release_after`.",
        "Growth of NVML's uncorrected ECC count (volatile or aggregate) within "
        "`checks.memory.window`, or errors since the last reset with a remap or retirement "
        "pending; evidence `errors`, `errors_since_reset`, `window_seconds`.",
        "Drain the GPU and reset it (`nvidia-smi -r`); the row-remap failure flag (GW-1103) "
        "says whether the board is condemned.",
        f"{XID_CATALOG}: XID 48 (Double Bit ECC Error, `WORKFLOW_XID_48`), 94 and 95 (contained "
        f"and uncontained memory errors); {MEMORY_GUIDE}: reset the GPU to remap the row.",
    ),
    FaultCode(
        "GW-1102",
        "memory",
        "ecc_sbe_storm",
        "Corrected (single-bit) ECC errors arrive faster than `checks.memory.sbe_storm_rate`: "
        "memory that is wearing. A warning.",
        "The rate of NVML's corrected ECC count over `checks.memory.window`; evidence "
        "`rate_per_second`, `errors`, `window_seconds`.",
        "Watch the board's row remaps (GW-1104, GW-1105); nothing is quarantined for it.",
        f"{XID_CATALOG}: XID 92 (High single-bit ECC error rate), immediate action `IGNORE`.",
    ),
    FaultCode(
        "GW-1103",
        "memory",
        "row_remap_failure",
        "A faulty memory row could not be remapped. Definitive: the board is quarantined for "
        "good and released only by an operator once repaired or replaced.",
        "`nvmlDeviceGetRemappedRows` reports `isFailure` for the board.",
        "Run NVIDIA's field diagnostic and open an RMA with the board's serial and the "
        "evidence bundle.",
        f'{MEMORY_GUIDE}, RMA policy: "the RMA criteria is met when the row-remapping failure '
        f'flag is set and validated by the field diagnostic"; {XID_CATALOG}: XID 64 (GPU '
        "memory remapping failure).",
    ),
    FaultCode(
        "GW-1104",
        "memory",
        "row_remap_pending",
        "A row remap is recorded and takes effect at the GPU's next reset.",
        "`nvmlDeviceGetRemappedRows` reports `isPending`.",
        "Reset the GPU when its jobs allow (`nvidia-smi -r`, or a reboot).",
        f'{MEMORY_GUIDE}, row remapping: "GPU reset is required" to apply it; {XID_CATALOG}: '
        "XID 63 (GPU memory remapping event).",
    ),
    FaultCode(
        "GW-1105",
        "memory",
        "row_remap_exhausted",
        "Memory banks with no spare rows left: the next uncorrectable error in such a bank "
        "cannot be remapped. A warning, not a criterion.",
        "`nvmlDeviceGetRowRemapperHistogram`: banks with no remapping available; evidence "
        "`banks_<availability>`.",
        "Plan a field diagnostic; on Blackwell a spare HBM channel may still repair the bank.",
        f"{MEMORY_GUIDE}, RMA policy: a remap attempt on a bank that already has eight "
        "uncorrectable rows remapped sets the row-remap failure flag (GW-1103).",
    ),
    FaultCode(
        "GW-1106",
        "memory",
        "sram_threshold_exceeded",
        "Uncorrectable SRAM errors past NVIDIA's threshold. Definitive.",
        "`nvmlDeviceGetSramEccErrorStatus` (version-checked) reports `bThresholdExceeded`.",
        "Run NVIDIA's field diagnostic and open an RMA.",
        f"{MEMORY_GUIDE}, GPU L2 memory RMA policy: more than 4 (parity) or 2 (SECDED) "
        "uncorrectable unique events within an address bank set the SRAM Threshold Exceeded "
        "flag.",
    ),
    FaultCode(
        "GW-1107",
        "memory",
        "retired_pages_pending",
        "Before Ampere: a page retirement is recorded and takes effect when the GPU is reset "
        "or the driver reloaded.",
        "NVML's retired-pages pending status.",
        "Reset the GPU (or reload the driver) when its jobs allow.",
        f'{PAGE_RETIREMENT}: XID 63, "New retired page, reload the driver to activate".',
    ),
    FaultCode(
        "GW-1108",
        "memory",
        "retired_pages_limit",
        "Before Ampere: the board retired `checks.memory.retired_pages_limit` (63) pages or "
        "more. Definitive.",
        "NVML's single- plus double-bit retired page counts; evidence `retired_pages` and the "
        "count by cause.",
        "Run NVIDIA's field diagnostic and open an RMA.",
        f'{MEMORY_GUIDE}, row remapping: legacy page retirement supported "a maximum of 64 '
        'retirements" and "a threshold of page retirements [...] usually resulted in '
        "investigation of whether the GPU was worthy of an RMA\"; DCGM's "
        "`DCGM_LIMIT_MAX_RETIRED_PAGES`.",
    ),
)

# The XID check names its finding after the kind of the XID (checks/xid_catalog.py):
# one fault code per kind, the XID itself in the evidence (`xid`, `xids`).
XID_EVIDENCE = (
    "The XIDs the driver logged for the GPU within `checks.xid.window` (NVML's events or the "
    "kernel log); evidence `xid` (the worst), `xids`, `count`, `nvidia_immediate`, "
    "`nvidia_investigatory`"
)

XIDS = (
    FaultCode(
        "GW-1201",
        "xid",
        "xid_hardware",
        "XIDs NVIDIA attributes to the GPU's hardware: drained for the reset or reboot NVIDIA "
        "asks for; definitive for XID 54 (auxiliary power), and for one that a reset or reboot "
        "cures and NVIDIA investigates as hardware when it comes back on the same board after "
        "`checks.xid.reboots_before_inspection` reboots within `checks.xid.reboot_window`.",
        f"{XID_EVIDENCE}, and `reboots` once it escalated.",
        "Follow the XID's immediate resolution (reset the GPU, reboot, check the cables); "
        "when it escalated, run the field diagnostic and open an RMA.",
        f"{XID_CATALOG}: the XID's immediate resolution (`RESET_GPU`, `RESTART_BM`, "
        "`CHECK_MECHANICALS`, the memory and NVLink workflows) and investigatory one "
        "(`CONTACT_SUPPORT`, `INVESTIGATE_LINK_SI`); the XIDs are listed below.",
    ),
    FaultCode(
        "GW-1202",
        "xid",
        "xid_software",
        "XIDs that need a GPU reset but whose investigation NVIDIA points at software (GSP, "
        "security faults, NVLink software errors).",
        f"{XID_EVIDENCE}.",
        "Reset the GPU; if it repeats, collect `nvidia-bug-report.sh` for the driver's vendor.",
        f"{XID_CATALOG}: immediate `RESET_GPU` (or `RESTART_VM`), investigatory `INVESTIGATE_SW`.",
    ),
    FaultCode(
        "GW-1203",
        "xid",
        "xid_application",
        "XIDs the application pays for (its channel was torn down); the GPU is not judged.",
        f"{XID_EVIDENCE}.",
        "Restart the application; look at the application if it repeats.",
        f"{XID_CATALOG}: immediate `RESTART_APP`.",
    ),
    FaultCode(
        "GW-1204",
        "xid",
        "xid_informational",
        "XIDs NVIDIA lists as informational: recorded (severity ok), nothing condemned.",
        f"{XID_EVIDENCE}.",
        "None.",
        f"{XID_CATALOG}: immediate `IGNORE` (or a software update, `UPDATE_SWFW`).",
    ),
    FaultCode(
        "GW-1205",
        "xid",
        "xid_recovery_action",
        "XID 154: the driver changed the GPU's recovery action. A warning; the action itself is "
        "GW-1806's.",
        f"{XID_EVIDENCE}.",
        "Follow GW-1806 (the recovery action the driver asks for).",
        f"{XID_CATALOG}: XID 154 (GPU Recovery Action Changed).",
    ),
    FaultCode(
        "GW-1206",
        "xid",
        "xid_unknown",
        "An XID this gpuwatchd's catalog does not know (a newer driver's): a warning, no verdict.",
        f"{XID_EVIDENCE}.",
        "Look the XID up in NVIDIA's current catalog.",
    ),
    FaultCode(
        "GW-1207",
        "xid",
        "xid_nvlink",
        "An NVLink5 XID (144-150) on one link of the GPU, as NVIDIA's decode of the kernel "
        "log's line grades it: critical where the decode resets the GPU, a warning otherwise; "
        "never definitive.",
        "The kernel log's `Xid ... Link N` line; evidence `xid`, `count`, `fatal`, `unit`, "
        "`intrinfo`, `error_status`, `window_seconds`.",
        "Reset the GPU when critical.",
        f"{XID_CATALOG}: XIDs 144-150 (`WORKFLOW_NVLINK5_ERR`), graded by NVIDIA's XID 144-150 "
        "decode as gpud mirrors it (`catalog_generated.go`).",
    ),
)
