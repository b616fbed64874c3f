"""PCIe AER of the GPUs' and HCAs' functions: the sysfs reader on trees in
aer.c's format, the aer check's grading, and the exported counters."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from gpu_history import POLL, T0, gpu
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatchd.checks import aer
from gpuwatchd.checks.aer import AerConfig
from gpuwatchd.export import pcie as pcie_export
from gpuwatchd.history import History
from gpuwatchd.model import PcieFunctionSample, PortSample, Reading, Severity, canonical_address
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources import PcieSourceConfig
from gpuwatchd.sources.pcie import PcieSource, _aer_lines, parse_aer

GPU_ADDRESS = "0000:18:00.0"
HCA_ADDRESS = "0000:c0:00.0"


def aer_file(total_name: str, **counts: int) -> str:
    """An aer_dev_* file as drivers/pci/pcie/aer.c writes it: `NAME count`
    lines, then the total."""
    lines = [f"{name} {count}" for name, count in counts.items()]
    return "\n".join([*lines, f"{total_name} {sum(counts.values())}"]) + "\n"


def function_dir(root: Path, address: str, vendor: str, pci_class: str, **files: str) -> Path:
    directory = root / "bus" / "pci" / "devices" / address
    directory.mkdir(parents=True)
    defaults = {
        "vendor": vendor,
        "class": pci_class,
        "current_link_speed": "32.0 GT/s PCIe",
        "current_link_width": "16",
        "aer_dev_correctable": aer_file("TOTAL_ERR_COR", RxErr=2, BadTLP=0, BadDLLP=1),
        "aer_dev_nonfatal": aer_file("TOTAL_ERR_NONFATAL", DLP=0, CmpltTO=3),
        "aer_dev_fatal": aer_file("TOTAL_ERR_FATAL", DLP=0, SDES=0),
    }
    for name, text in {**defaults, **files}.items():
        (directory / name).write_text(text)
    return directory


def node_tree(root: Path, **gpu_files: str) -> Path:
    function_dir(root, GPU_ADDRESS, "0x10de", "0x030200", **gpu_files)
    hca = function_dir(root, HCA_ADDRESS, "0x15b3", "0x020700")
    # An NVSwitch (a bridge) and a NIC of another vendor: not read.
    function_dir(root, "0000:05:00.0", "0x10de", "0x068000")
    function_dir(root, "0000:06:00.0", "0x8086", "0x020000")
    (root / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    (root / "class" / "infiniband" / "mlx5_0" / "device").symlink_to(hca)
    return root


def poll(root: Path) -> Reading:
    return PcieSource(PcieSourceConfig(sysfs_root=str(root))).poll(T0)


def test_a_gpu_and_an_hca_function_are_read_and_nothing_else(tmp_path: Path) -> None:
    reading = poll(node_tree(tmp_path))
    assert reading.error is None
    gpu_function, hca_function = reading.pcie_functions or ()
    assert (gpu_function.address, gpu_function.kind, gpu_function.name) == (
        GPU_ADDRESS,
        "gpu",
        None,
    )
    assert (hca_function.address, hca_function.kind, hca_function.name) == (
        HCA_ADDRESS,
        "hca",
        "mlx5_0",
    )
    assert gpu_function.aer_errors == {"correctable": 3, "nonfatal": 3, "fatal": 0}
    assert gpu_function.aer_causes == {
        "correctable:RxErr": 2,
        "correctable:BadDLLP": 1,
        "nonfatal:CmpltTO": 3,
    }
    assert (gpu_function.link_generation, gpu_function.link_width) == (5, 16)


def test_a_garbage_aer_file_is_an_absent_severity_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = node_tree(tmp_path, aer_dev_fatal="DLP zero\nTOTAL_ERR_FATAL 0\n")
    source = PcieSource(PcieSourceConfig(sysfs_root=str(root)))
    with caplog.at_level(logging.WARNING):
        first = source.poll(T0)
        source.poll(T0 + POLL)
    function = (first.pcie_functions or ())[0]
    assert "fatal" not in function.aer_errors and function.aer_errors["nonfatal"] == 3
    said = [r.getMessage() for r in caplog.records if "aer_dev_fatal" in r.getMessage()]
    assert len(said) == 1 and "not a number" in said[0]


def test_a_file_without_its_total_line_is_refused() -> None:
    with pytest.raises(ValueError, match="no TOTAL_ERR_COR line"):
        parse_aer("RxErr 1\nBadTLP 0\n", "TOTAL_ERR_COR")
    with pytest.raises(ValueError, match="not a 'NAME count' line"):
        parse_aer("RxErr 1 2\nTOTAL_ERR_COR 1\n", "TOTAL_ERR_COR")


# aer.c's names (its bit-numbered name for a bit it leaves unnamed too) and
# others; lines it never writes (a bit line of another file's array, past bit
# 31 or with a leading zero, a name past 41 characters, other separators,
# counts of 20 digits and past a u64, digits of another script).
AER_NAMES = st.one_of(
    st.sampled_from(["RxErr", "BadTLP", "TOTAL_ERR_COR", "dev_cor_errs_bit[5]"]),
    st.integers(0, 31).map(lambda bit: f"dev_cor_errs_bit[{bit}]"),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,40}", fullmatch=True),
)
AER_COUNTS = st.one_of(st.integers(0, 1000), st.integers(0, 10**19 - 1)).map(str)
ODD_AER_LINES = st.one_of(
    st.sampled_from(
        [
            "dev_fatal_errs_bit[5] 1",
            "dev_cor_errs_bit[32] 1",
            "dev_cor_errs_bit[05] 1",
            "dev_cor_errs_bit[] 1",
            "E" * 42 + " 1",
            "RxErr  1",
            "RxErr\t1",
        ]
    ),
    st.sampled_from([2**64 - 1, 2**64, "0" * 20, "0" * 21, -1, "\u0661"]).map(
        lambda count: f"RxErr {count}"
    ),
    st.text(),
)


@st.composite
def aer_texts(draw: st.DrawFn) -> str:
    """Mostly aer.c's format, a name and a count a line with the total among
    them; at times without the total, or with a line it does not write."""
    lines = [f"{name} {draw(AER_COUNTS)}" for name in draw(st.lists(AER_NAMES, max_size=70))]
    if draw(st.booleans()):
        where = draw(st.integers(0, len(lines)))
        lines.insert(where, f"TOTAL_ERR_COR {draw(AER_COUNTS)}")
    if draw(st.integers(0, 3)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(ODD_AER_LINES))
    return draw(st.sampled_from(["\n", "\r\n", "\x0b"])).join(lines)


def _outcome(parse: Callable[[str, str], tuple[int, dict[str, int]]], text: str) -> object:
    try:
        return parse(text, "TOTAL_ERR_COR")
    except ValueError as error:
        return f"refused: {error}"


@settings(max_examples=400, deadline=None)
@given(aer_texts())
def test_any_aer_text_reads_as_it_does_line_by_line(text: str) -> None:
    """parse_aer takes a file in aer.c's exact format in one regex pass:
    whatever the text, the totals, causes and refusals are those of the
    line-by-line parser."""
    assert _outcome(parse_aer, text) == _outcome(_aer_lines, text)


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        (f"TOTAL_ERR_COR {2**64 - 1}", (2**64 - 1, {})),
        ("RxErr 00000000000000000005\nTOTAL_ERR_COR 5", (5, {"RxErr": 5})),
        ("TOTAL_ERR_COR 00000000000000000005", (5, {})),
        (f"TOTAL_ERR_COR {2**64}", "refused: not a u64"),
        (f"RxErr {2**64}\nTOTAL_ERR_COR 5", "refused: not a u64"),
    ],
)
def test_a_count_at_the_edge_of_a_u64_reads_as_it_does_line_by_line(
    text: str, outcome: object
) -> None:
    """Counts of 20 digits, which the one-pass format leaves to the line
    parser, on the last line and before it."""
    got = _outcome(parse_aer, text)
    assert got == _outcome(_aer_lines, text)
    assert got == outcome if isinstance(outcome, tuple) else str(got).startswith(str(outcome))


# aer_dev_correctable as aer_stats_dev_attr writes it on a kernel whose
# string table leaves bit 5 unnamed (aer_correctable_error_string: RxErr at
# bit 0, BadTLP at 6), after 3 errors there: `#stats_array "_bit[%d] %llu\n"`.
CORRECTABLE_WITH_AN_UNNAMED_BIT = (
    "RxErr 2\n"
    "dev_cor_errs_bit[5] 3\n"
    "BadTLP 0\n"
    "BadDLLP 1\n"
    "Rollover 0\n"
    "Timeout 0\n"
    "NonFatalErr 0\n"
    "CorrIntErr 0\n"
    "HeaderOF 0\n"
    "TOTAL_ERR_COR 6\n"
)


def test_errors_of_a_bit_aer_c_does_not_name_are_counted_under_that_bit(
    tmp_path: Path,
) -> None:
    root = node_tree(tmp_path, aer_dev_correctable=CORRECTABLE_WITH_AN_UNNAMED_BIT)
    function = (poll(root).pcie_functions or ())[0]
    assert function.aer_errors["correctable"] == 6
    assert {key: n for key, n in function.aer_causes.items() if key.startswith("correctable:")} == {
        "correctable:RxErr": 2,
        "correctable:dev_cor_errs_bit[5]": 3,
        "correctable:BadDLLP": 1,
    }


@pytest.mark.parametrize(
    "line",
    ["dev_fatal_errs_bit[5] 3", "dev_cor_errs_bit[32] 3", "dev_cor_errs_bit[05] 3"],
)
def test_a_bit_line_aer_c_cannot_write_in_that_file_is_refused(line: str) -> None:
    """Another file's array, a bit past the 32 of the status register, a
    number as %d never prints it."""
    with pytest.raises(ValueError, match="not a 'NAME count' line"):
        parse_aer(f"RxErr 0\n{line}\nTOTAL_ERR_COR 3\n", "TOTAL_ERR_COR")


def test_an_aer_file_of_more_lines_than_aer_c_writes_is_refused() -> None:
    text = aer_file("TOTAL_ERR_COR", **{f"Err{bit}": bit for bit in range(64)})
    with pytest.raises(ValueError, match="65 lines"):
        parse_aer(text.strip(), "TOTAL_ERR_COR")


def test_an_aer_file_with_two_total_lines_is_an_absent_severity_not_a_fault(
    tmp_path: Path,
) -> None:
    # Review adversarial-2, row 307: 0 then 5; aer.c writes each line once.
    root = node_tree(tmp_path, aer_dev_fatal="DLP 0\nTOTAL_ERR_FATAL 0\nTOTAL_ERR_FATAL 5\n")
    function = (poll(root).pcie_functions or ())[0]
    assert "fatal" not in function.aer_errors and function.aer_errors["nonfatal"] == 3
    with pytest.raises(ValueError, match="TOTAL_ERR_FATAL twice"):
        parse_aer("TOTAL_ERR_FATAL 0\nTOTAL_ERR_FATAL 5\n", "TOTAL_ERR_FATAL")


def test_a_function_without_aer_has_no_aer_values_and_the_rest_is_read(tmp_path: Path) -> None:
    root = node_tree(tmp_path)
    for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        (root / "bus" / "pci" / "devices" / GPU_ADDRESS / name).unlink()
    function = (poll(root).pcie_functions or ())[0]
    assert function.aer_errors == {} and function.link_width == 16


def test_an_unchanged_function_is_the_same_sample_and_a_changed_one_is_read_anew(
    tmp_path: Path,
) -> None:
    root = node_tree(tmp_path)
    source = PcieSource(PcieSourceConfig(sysfs_root=str(root)))
    gpu_before, hca_before = source.poll(T0).pcie_functions or ()
    (root / "bus" / "pci" / "devices" / GPU_ADDRESS / "aer_dev_fatal").write_text(
        aer_file("TOTAL_ERR_FATAL", DLP=1, SDES=0)
    )
    gpu_after, hca_after = source.poll(T0 + POLL).pcie_functions or ()
    assert hca_after is hca_before
    assert gpu_after is not gpu_before
    assert gpu_after.aer_errors == {"correctable": 3, "nonfatal": 3, "fatal": 1}
    assert gpu_after.aer_causes["fatal:DLP"] == 1
    assert (source.poll(T0 + 2 * POLL).pcie_functions or ())[0] is gpu_after


def test_a_bus_entry_replaced_by_another_function_is_judged_anew(tmp_path: Path) -> None:
    """Whether an entry is a GPU is read once per entry: a function removed
    and another added at its address (hot plug) is a new entry."""
    root = node_tree(tmp_path)
    source = PcieSource(PcieSourceConfig(sysfs_root=str(root)))
    assert [f.kind for f in source.poll(T0).pcie_functions or ()] == ["gpu", "hca"]
    devices = root / "bus" / "pci" / "devices"
    # Both exist at once while swapped, so the new entry cannot reuse the inode.
    nic = function_dir(tmp_path / "plugged", GPU_ADDRESS, "0x8086", "0x020000")
    (devices / GPU_ADDRESS).rename(tmp_path / "unplugged")
    nic.rename(devices / GPU_ADDRESS)
    assert [f.address for f in source.poll(T0 + POLL).pcie_functions or ()] == [HCA_ADDRESS]


def test_a_node_without_gpus_or_hcas_is_a_reading_with_an_error(tmp_path: Path) -> None:
    reading = poll(tmp_path)
    assert reading.pcie_functions == () and reading.error


def test_nvml_and_sysfs_bus_ids_name_the_same_function() -> None:
    assert canonical_address("00000000:18:00.0") == GPU_ADDRESS
    assert canonical_address("0000:C0:00.0") == HCA_ADDRESS
    assert canonical_address("garbage") is None


# --- the check ----------------------------------------------------------------


def function(kind: str = "gpu", name: str | None = None, **errors: int) -> PcieFunctionSample:
    address = GPU_ADDRESS if kind == "gpu" else HCA_ADDRESS
    counts = {"correctable": 0, "nonfatal": 0, "fatal": 0, **errors}
    return PcieFunctionSample(
        address=address, kind=kind, name=name, aer_errors=counts, link_generation=5, link_width=16
    )


DEFAULTS = AerConfig()


def record(
    history: History, k: int, sample: PcieFunctionSample, named: bool = True, ports: bool = False
) -> float:
    """Poll `k`'s readings into `history`; its time."""
    time = T0 + k * POLL
    gpus = (gpu(3, pci_bus_id="00000000:18:00.0"),) if named else ()
    history.record(Reading(source="nvml", time=time, gpus=gpus))
    if ports:
        port = PortSample(device="mlx5_0", port=1)
        history.record(Reading(source="infiniband", time=time, ports=(port,)))
    history.record(Reading(source="pcie", time=time, pcie_functions=(sample,)))
    return time


def judged(
    samples: list[PcieFunctionSample],
    named: bool = True,
    ports: bool = False,
    config: AerConfig = DEFAULTS,
) -> list[tuple[str, str, Severity]]:
    history = History(max_age_seconds=7200.0)
    for k, sample in enumerate(samples):
        time = record(history, k, sample, named, ports)
    output = aer.run(history, time, config)
    return [(f.subject, f.code, f.severity) for f in output.findings]


def test_a_new_fatal_error_on_a_gpu_is_critical_on_that_gpu_and_not_definitive() -> None:
    samples = [function(fatal=0)] * 3 + [function(fatal=1)]
    assert judged(samples) == [("gpu:3", "aer_fatal_errors", Severity.CRITICAL)]


def test_fatal_errors_from_before_the_daemon_started_raise_nothing() -> None:
    assert judged([function(fatal=2)] * 5) == []


def test_a_new_nonfatal_error_on_an_hca_warns_on_its_ports() -> None:
    samples = [function("hca", "mlx5_0"), function("hca", "mlx5_0", nonfatal=1)]
    assert judged(samples, ports=True) == [("ib:mlx5_0/1", "aer_nonfatal_errors", Severity.WARN)]


def test_a_fatal_error_on_a_gpu_nvml_does_not_name_only_warns_on_the_node() -> None:
    samples = [function(fatal=0), function(fatal=1)]
    assert judged(samples, named=False) == [("node", "aer_fatal_errors", Severity.WARN)]


def test_correctable_errors_within_a_gen5_x16_links_allowance_raise_nothing() -> None:
    # 30 a minute: under the 31 a 1e-12 BER gives a Gen5 x16 link.
    samples = [function(correctable=5 * k) for k in range(13)]
    assert judged(samples) == []


def test_a_correctable_storm_only_warns() -> None:
    samples = [function(correctable=100 * k) for k in range(13)]
    assert judged(samples) == [("gpu:3", "aer_correctable_storm", Severity.WARN)]


def test_a_fatal_error_keeps_its_finding_for_the_window_then_clears() -> None:
    samples = [function(fatal=0), function(fatal=1)] + [function(fatal=1)] * 370
    assert judged(samples[:100]) == [("gpu:3", "aer_fatal_errors", Severity.CRITICAL)]
    assert judged(samples) == []


def test_judged_every_poll_flat_counts_age_out_of_their_windows_as_from_a_fresh_history() -> None:
    # A storm, then a fatal error, then the very same sample poll after poll
    # (as a source hands back an unchanged one): each poll's findings on the
    # one history are those of a history made afresh, until the storm's
    # minute and the fatal error's window have passed.
    config = AerConfig(window=120.0)
    stopped = function(fatal=1, correctable=1200)
    samples = [function(correctable=100 * k) for k in range(13)] + [stopped] * 15
    history = History(max_age_seconds=7200.0)
    each_poll = []
    for k, sample in enumerate(samples):
        time = record(history, k, sample)
        each_poll.append([(f.subject, f.code) for f in aer.run(history, time, config).findings])
    fresh = [
        [(s, code) for s, code, _ in judged(samples[: k + 1], config=config)]
        for k in range(len(samples))
    ]
    assert each_poll == fresh
    storm, fatal = ("gpu:3", "aer_correctable_storm"), ("gpu:3", "aer_fatal_errors")
    # The storm stopped at poll 12 and is under the link's 31 a minute from
    # poll 18; the fatal error of poll 13 leaves the 120 s window at poll 25.
    assert [storm in found for found in each_poll] == [1 <= k <= 17 for k in range(len(samples))]
    assert [fatal in found for found in each_poll] == [13 <= k <= 24 for k in range(len(samples))]


# --- export -------------------------------------------------------------------


def test_aer_totals_are_exported_per_function_and_severity_with_the_gpu_named() -> None:
    snapshot = Snapshot(
        time=T0,
        gpus=(gpu(3, pci_bus_id="00000000:18:00.0"),),
        pcie_functions=(function(fatal=1), function("hca", "mlx5_0")),
    )
    (family,) = pcie_export.families(snapshot)
    samples = {
        (s.labels["device"], s.labels["kind"], s.labels["name"], s.labels["severity"]): s.value
        for s in family.samples
    }
    assert family.name == "gpuwatchd_pcie_aer_errors" and family.type == "counter"
    assert samples[(GPU_ADDRESS, "gpu", "3", "fatal")] == 1
    assert samples[(HCA_ADDRESS, "hca", "mlx5_0", "correctable")] == 0
    assert len(samples) == 6
