"""Fault codes of the canaries (block 16), of DCGM's diagnostic (block 17), of
the GPU's presence, the driver and NVML (block 18), and of the node, the
daemon and its actions (block 19)."""

from __future__ import annotations

from gpuwatchd.faults.code import FaultCode
from gpuwatchd.faults.sources import DCGM_DIAGNOSTICS, XID_CATALOG

CANARY_EVIDENCE = (
    "evidence `canary`, `seed`, `mismatch_count`, `mismatched_bits`, the first mismatch's "
    "`first_expected_bits` and `first_actual_bits`, `sms` and `lanes` where the backend gives them"
)
OFFLINE_DIAGNOSTIC = "`gpuwatchd canary --dcgm 3` (DCGM's `dcgmi diag -r 3`) on the GPU"

CANARIES = (
    FaultCode(
        "GW-1601",
        "sdc",
        "sdc_confirmed",
        "Silent data corruption confirmed: a known-answer canary computed wrong on the GPU, "
        "and wrong again on a re-run while a sibling of the same model computed it right; or "
        "two mismatches of the board's on different canaries or seeds, from bursts at least "
        "`canary.interval` apart, within `canary.history_window`. Definitive.",
        f"The canary results of the GPU and of its sibling; {CANARY_EVIDENCE}, "
        "`mismatches_on_record`.",
        f"Keep the board out of service; run NVIDIA's offline diagnostic ({OFFLINE_DIAGNOSTIC}) "
        "and open an RMA with the evidence bundle.",
        "No NVIDIA criterion: NVIDIA's own is its offline diagnostic; the rule follows the "
        "fleet studies of silent data corruption (reproduce, and tell the device from the "
        "software by a healthy peer).",
    ),
    FaultCode(
        "GW-1602",
        "sdc",
        "sdc_cpu_core_confirmed",
        "The same as GW-1601 for a host CPU core (references computed on two other cores). "
        "Definitive, on the node.",
        f"The canary results of the core and of two others; {CANARY_EVIDENCE}.",
        "Take the node out of service and have its CPU diagnosed by the server's vendor.",
    ),
    FaultCode(
        "GW-1603",
        "sdc",
        "sdc_suspected",
        "A canary mismatched on the GPU once and not on a re-run, or again with no sibling to "
        "tell a GPU fault from a software one: the GPU is watched with more frequent canaries. "
        "A warning.",
        f"The mismatching result; {CANARY_EVIDENCE}, `watch_until`, and `offline_diagnostic` "
        "when no sibling could judge.",
        f"None while watched; with no sibling, run {OFFLINE_DIAGNOSTIC}.",
    ),
    FaultCode(
        "GW-1604",
        "sdc",
        "canary_software_fault",
        "A canary mismatched on several devices at once: a software, driver or reference "
        "problem, not a GPU fault. Nothing is quarantined. A warning on the node.",
        f"The results of every device; {CANARY_EVIDENCE}, `devices`.",
        "Check the node's CUDA, driver and library versions against the canaries' references.",
    ),
)

DCGM = (
    FaultCode(
        "GW-1701",
        "dcgm",
        "dcgm_diag_failed",
        "DCGM's diagnostic (`gpuwatchd canary --dcgm LEVEL`, run by an operator or a Slurm "
        "epilog, never by the daemon) failed a test on the GPU: a result or a test summary "
        "with status Fail, whatever dcgmi's exit status. On the node when the failure names "
        "no board of this node. Critical; not definitive: nothing is quarantined on it, the "
        "operator decides.",
        "The run (`level`, `run_time`, `dcgm_version`), the failed `tests`, "
        "`dcgm_error_ids`, the board's `uuid`, `serial`, `dcgm_gpu_id` and `matched_by` "
        "(how DCGM's GPU id was matched to the board); the whole dcgmi output is in the run's "
        "record and in `gpuwatchd report`.",
        "Drain the node; attach `gpuwatchd report gpu:N` to the hardware ticket, with "
        "nvidia-bug-report.sh's output as NVIDIA's RMA process asks.",
        f"{DCGM_DIAGNOSTICS}: levels 3 and 4 are the administrator's post-mortem tests; DCGM "
        "gives the verdict, NVIDIA names no RMA criterion of its own for it.",
    ),
    FaultCode(
        "GW-1702",
        "dcgm",
        "dcgm_diag_not_run",
        "DCGM's diagnostic could not run: no dcgmi, no host engine, output that is no "
        "diagnostic's, a runtime error, or the level's timeout. A warning on the node; "
        "nothing about the GPUs.",
        "`level`, `run_time`, and the reason in the message.",
        "Install DCGM and start nv-hostengine (`systemctl start nvidia-dcgm`), then run it again.",
    ),
)

PRESENCE_AND_DRIVER = (
    FaultCode(
        "GW-1801",
        "gpu_lost",
        "gpu_lost",
        "The GPU fell off the bus: it and the node are drained at once for the reboot that "
        "brings it back, and released once it is back and quiet. Definitive when it falls off "
        "again after `checks.xid.reboots_before_inspection` reboots within "
        "`checks.xid.reboot_window`, counted on its UUID.",
        "NVML's `GPU_IS_LOST`, or every call failing while the kernel log or NVML's events "
        "hold XID 79 for its bus; evidence the GPUs lost and, once it escalated, `reboots`.",
        "Reboot the node; when definitive, reseat or replace the board and open an RMA.",
        f"{XID_CATALOG}: XID 79 (GPU has fallen off the bus), immediate `RESTART_BM`, "
        "investigatory `CONTACT_SUPPORT`.",
    ),
    FaultCode(
        "GW-1802",
        "gpu_lost",
        "gpu_missing",
        "NVML enumerates fewer GPUs than expected on the node. Critical on the node, never "
        "definitive.",
        "The GPUs NVML lists against `checks.gpu_lost.expected_gpus` or those of the node's "
        "first healthy start (kept in the state database); evidence `expected`, `present`, "
        "`missing`.",
        "Reboot the node; reseat or replace a GPU that stays missing.",
    ),
    FaultCode(
        "GW-1803",
        "gpu_lost",
        "gpu_unresponsive",
        "The GPU is up but answered no NVML call with a value (no handle, or every call an "
        "error such as UNKNOWN or TIMEOUT): no fault on it can be seen. Critical once it held "
        "for `policy.confirm_for`.",
        "The NVML return codes of the poll's calls for the GPU.",
        "Reset the GPU; reboot the node if it does not come back.",
    ),
    FaultCode(
        "GW-1804",
        "gpu_lost",
        "gpu_read_hung",
        "An NVML call for the GPU did not return within `sources.nvml.read_timeout`. A "
        "warning: a hang alone is no evidence of a fault.",
        "The call that hung, in the message.",
        "Watch it; collect `nvidia-bug-report.sh` if it repeats.",
    ),
    FaultCode(
        "GW-1805",
        "recovery",
        "gpu_reset_required",
        "A call answers `NVML_ERROR_RESET_REQUIRED`: the GPU requires a reset before it can be "
        "used. Drained at once, released once quiet after the reset.",
        "The NVML return code.",
        "Reset the GPU (`nvidia-smi -r`) or reboot the node.",
        'nvml.h: "the GPU requires a reset before it can be used again".',
    ),
    FaultCode(
        "GW-1806",
        "recovery",
        "gpu_recovery_action",
        "The driver asks for a recovery action (GPU reset, drain and reset, bus reset, node "
        "reboot, drain P2P): drained at once, released once the driver says none. A warning "
        "for an action this gpuwatchd does not know.",
        "`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (R565 on), or on R560 its reset and "
        "drain-and-reset status fields; evidence `recovery_action`.",
        "Do what the driver asks (`nvidia-smi -r` for a reset).",
        f"nvml.h `nvmlDeviceGpuRecoveryAction_t`; {XID_CATALOG}: XID 154 announces each change.",
    ),
    FaultCode(
        "GW-1807",
        "gpu_lost",
        "xid_events_not_received",
        "NVML's XID event wait keeps failing for the GPU: faults the driver announces would be "
        "missed. A warning.",
        "The event set's return codes.",
        "Check the driver (`dmesg`); the kernel log source still reads XIDs where configured.",
    ),
    FaultCode(
        "GW-1808",
        "driver",
        "nvml_unavailable",
        "NVML cannot start on a node whose PCI bus has NVIDIA GPUs: nothing can be watched and "
        "CUDA cannot run. Critical on the node, confirmed, never definitive.",
        "`nvmlInit`'s error and the NVIDIA functions on the PCI bus; evidence `nvml_error`, "
        "`nvml_return`, `pci`.",
        "Reboot after a driver upgrade (library and kernel module of two versions); otherwise "
        "repair the driver's install.",
    ),
    FaultCode(
        "GW-1809",
        "gpu_lost",
        "nvml_no_permission",
        "NVML refuses GPUs to the daemon (NO_PERMISSION): a configuration error of the node. "
        "A warning.",
        "The GPUs whose handle NVML refuses; evidence `gpus`.",
        "Give the daemon's user read-write access to /dev/nvidia* (the unit's "
        "`DeviceAllow=char-nvidia rw`).",
    ),
    FaultCode(
        "GW-1810",
        "driver",
        "nvidia_uvm_not_loaded",
        "The nvidia-uvm kernel module is not loaded: CUDA cannot start, so no canary runs. A "
        "warning.",
        "`/sys/module/nvidia_uvm`.",
        "`nvidia-modprobe -u -c=0` before the daemon starts, as the shipped unit does.",
    ),
    FaultCode(
        "GW-1811",
        "driver",
        "persistence_mode_off",
        "Persistence mode is off: the driver tears an idle GPU down and the next call waits for "
        "it. A warning.",
        "NVML's persistence mode; evidence `gpus`.",
        "`systemctl enable --now nvidia-persistenced`.",
    ),
    FaultCode(
        "GW-1812",
        "config_drift",
        "config_drift",
        "GPUs of one model on the node disagree on VBIOS, ECC, persistence or MIG mode, power "
        "limit or application clocks. A warning; the daemon never changes a setting.",
        "Each GPU's settings as NVML reads them; evidence `settings`.",
        "Set the GPUs alike.",
    ),
)


def _scheduler_failure(fault_id: str, code: str, what: str) -> FaultCode:
    return FaultCode(
        fault_id,
        "actions",
        code,
        f"{what}. A warning on the node; retried every `retry_interval`.",
        "The command's or the API's error, in the message; evidence `scheduler`, `node`.",
        "Fix what the message names (the scheduler's reachability, the daemon's rights).",
    )


NODE_AND_DAEMON = (
    FaultCode(
        "GW-1901",
        "policy",
        "gpu_quarantine_ratio",
        "At least `policy.node_quarantine_ratio` (one in eight) of the node's GPUs or their "
        "links are quarantined: the node is drained at once, released as soon as the share is "
        "below the ratio.",
        "The node's quarantines; evidence `quarantined_gpus`, `gpus`.",
        "Deal with the quarantined GPUs' own fault codes.",
    ),
    FaultCode(
        "GW-1902",
        "quarantine",
        "quarantined_gpu_absent",
        "A quarantined board (by UUID) is no longer on the node: its quarantine stays with it. "
        "A warning.",
        "The quarantines whose UUID NVML no longer lists; evidence `uuids`, `last_indices`, "
        "`pci_bus_ids`.",
        "Release it (`gpuwatchd quarantine release gpu:<UUID>`) once the board was removed on "
        "purpose; reseat or replace it otherwise.",
    ),
    FaultCode(
        "GW-1903",
        "store",
        "state_lost",
        "The state database was damaged at start and moved aside: its quarantines, journal and "
        "queued webhook events are lost. A warning.",
        "The database's damage, in the message; evidence `path` (the new database).",
        "Check the node's scheduler drains by hand and re-apply manual quarantines; keep the "
        "damaged copy for the ticket.",
    ),
    FaultCode(
        "GW-1904",
        "actions",
        "fleet_drain_withheld",
        "Fleet safety held a scheduler drain back (too much of the fleet drained, or "
        "Prometheus not answering): the node keeps taking jobs. A warning.",
        "The fleet's answer, in the message; evidence `scheduler`, `node`.",
        "Look at the fleet's quarantines, or drain the node by hand.",
    ),
    _scheduler_failure("GW-1905", "slurm_show_failed", "`scontrol show node` failed"),
    _scheduler_failure("GW-1906", "slurm_drain_failed", "Draining the node in Slurm failed"),
    _scheduler_failure("GW-1907", "slurm_resume_failed", "Resuming the node in Slurm failed"),
    _scheduler_failure(
        "GW-1908", "slurm_comment_failed", "Setting the node's Slurm comment failed"
    ),
    FaultCode(
        "GW-1909",
        "actions",
        "slurm_drain_unexplained",
        "The node is drained with gpuwatchd's tag but the journal does not say why (state "
        "lost?): left drained. A warning.",
        "The drain reason in Slurm; evidence `scheduler`, `node`.",
        "Resume the node by hand once the fault is ruled out.",
    ),
    _scheduler_failure(
        "GW-1910", "kubernetes_config_failed", "The kubeconfig or in-cluster config is unusable"
    ),
    _scheduler_failure(
        "GW-1911", "kubernetes_read_failed", "Reading the node from the Kubernetes API failed"
    ),
    _scheduler_failure("GW-1912", "kubernetes_cordon_failed", "Cordoning the node failed"),
    _scheduler_failure("GW-1913", "kubernetes_uncordon_failed", "Uncordoning the node failed"),
    _scheduler_failure(
        "GW-1914", "kubernetes_condition_failed", "Setting the node's conditions failed"
    ),
    FaultCode(
        "GW-1915",
        "actions",
        "kubernetes_drain_unexplained",
        "The node carries gpuwatchd's taint but the journal does not say why (state lost?): "
        "left in place. A warning.",
        "The taint's reason annotation; evidence `scheduler`, `node`.",
        "Remove the taint by hand once the fault is ruled out.",
    ),
)
