"""The documents the catalog cites for NVIDIA's XIDs and RMA criteria: each
title as the entries write it (in italics), and where it is published."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

XID_CATALOG = "NVIDIA, *Analyzing Xid Errors with the Xid Catalog*"
MEMORY_GUIDE = "NVIDIA, *GPU Memory Error Management*"
PAGE_RETIREMENT = "NVIDIA, *Dynamic Page Retirement*"
FABRIC_MANAGER = "NVIDIA, *Fabric Manager User Guide*"
DCGM_DIAGNOSTICS = "NVIDIA, *DCGM Diagnostics*"

_DEPLOY = "https://docs.nvidia.com/deploy"
_MEMORY = f"{_DEPLOY}/a100-gpu-mem-error-mgmt"

# Title -> its pages, the first the document itself.
SOURCES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "Analyzing Xid Errors with the Xid Catalog": (
            f"{_DEPLOY}/xid-errors/analyzing-xid-catalog.html",
        ),
        "GPU Memory Error Management": (
            f"{_MEMORY}/index.html",
            f"{_MEMORY}/row-remapping.html",
            f"{_MEMORY}/rma-policy-thresholds-for-row-remapping.html",
        ),
        "Dynamic Page Retirement": (f"{_DEPLOY}/dynamic-page-retirement/index.html",),
        "Fabric Manager User Guide": (
            "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/",
        ),
        "DCGM Diagnostics": (
            "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html",
            "https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/"
            "dcgmi/dcgmi-diag.html",
        ),
        # What a vendor ticket holds: nvidia-bug-report.sh and the field diagnostic.
        "RMA Process": (f"{_DEPLOY}/rma-process/index.html",),
        "NVIDIA GPU Debug Guidelines": (f"{_DEPLOY}/gpu-debug-guidelines/index.html",),
        # nvml.h's texts, quoted by the entries that rest on NVML's word.
        "NVML API Reference": (f"{_DEPLOY}/nvml-api/index.html",),
    }
)
