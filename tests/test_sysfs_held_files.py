"""Sysfs files held open between polls (`HeldFiles`) and the PCIe source over
them: a held file is re-read at offset 0, as sysfs is meant to be read again,
and never says what a file renamed over it or removed said.

The directories here are stamped a minute back (`settled`), as a node's are
long after boot: only then are the files held from poll to poll (a directory
changed in the last seconds has them opened anew at every read)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gpu_history import POLL, T0
from test_pcie_aer import GPU_ADDRESS, aer_file, function_dir, node_tree

from gpuwatchd.sources import PcieSourceConfig
from gpuwatchd.sources.pcie import HeldFiles, PcieSource


def settled(directory: Path) -> Path:
    """`directory` as if it last changed a minute ago."""
    past = time.time_ns() - 60 * 1_000_000_000
    os.utime(directory, ns=(past, past))
    return directory


def open_under(root: Path) -> set[str]:
    """The files under `root` this process holds open."""
    held = set()
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue  # the listing's own descriptor, closed since
        if target.startswith(f"{root}/"):
            held.add(target.removeprefix(f"{root}/"))
    return held


def folder(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "port"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    return settled(directory)


def replaced(path: Path, text: str) -> None:
    """`path` replaced by rename, as the simulator and a capture's writer do."""
    staged = path.parent.parent / f"{path.name}.staged"
    staged.write_text(text)
    os.replace(staged, path)


def test_a_held_file_rewritten_in_place_reads_anew_through_the_same_descriptor(
    tmp_path: Path,
) -> None:
    directory = folder(tmp_path, state="4: ACTIVE\n", rate="400 Gb/sec (4X NDR)\n")
    files = HeldFiles(str(directory), ("state", "rate"))
    assert files.read() == (b"4: ACTIVE\n", b"400 Gb/sec (4X NDR)\n")
    descriptors = sorted(os.listdir("/proc/self/fd"))
    (directory / "state").write_text("1: DOWN\n")  # the same inode: as sysfs regenerates it
    assert files.read() == (b"1: DOWN\n", b"400 Gb/sec (4X NDR)\n")
    assert sorted(os.listdir("/proc/self/fd")) == descriptors
    assert open_under(tmp_path) == {"port/state", "port/rate"}
    files.close()
    assert open_under(tmp_path) == set()


def test_a_file_renamed_over_a_held_one_is_what_the_next_read_says(tmp_path: Path) -> None:
    directory = folder(tmp_path, symbol_error="0\n")
    files = HeldFiles(str(directory), ("symbol_error",))
    assert files.read() == (b"0\n",)
    replaced(directory / "symbol_error", "7\n")
    assert files.read() == (b"7\n",)


def test_a_removed_held_file_is_no_reading_and_is_not_served_from_its_descriptor(
    tmp_path: Path,
) -> None:
    directory = folder(tmp_path, state="4: ACTIVE\n", rate="400 Gb/sec (4X NDR)\n")
    files = HeldFiles(str(directory), ("state", "rate"))
    assert files.read() is not None
    (directory / "state").unlink()
    assert files.read() is None
    assert open_under(tmp_path) == set()


def test_a_removed_and_recreated_directory_is_read_from_its_new_files(tmp_path: Path) -> None:
    directory = folder(tmp_path, state="4: ACTIVE\n")
    files = HeldFiles(str(directory), ("state",))
    assert files.read() == (b"4: ACTIVE\n",)
    # The new one exists before the old goes, so it cannot reuse the inode;
    # stamped as the old one was, so only its identity tells them apart.
    new = tmp_path / "new"
    new.mkdir()
    (new / "state").write_text("1: DOWN\n")
    stamp = directory.stat()
    shutil.rmtree(directory)
    new.rename(directory)
    os.utime(directory, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert files.read() == (b"1: DOWN\n",)


def test_a_removed_directory_is_no_reading_and_its_files_are_let_go(tmp_path: Path) -> None:
    directory = folder(tmp_path, state="4: ACTIVE\n")
    files = HeldFiles(str(directory), ("state",))
    assert files.read() is not None
    shutil.rmtree(directory)
    assert files.read() is None
    assert open_under(tmp_path) == set()


def test_files_that_do_not_all_open_are_no_reading_until_the_directory_changes(
    tmp_path: Path,
) -> None:
    directory = folder(tmp_path, state="4: ACTIVE\n")
    files = HeldFiles(str(directory), ("state", "rate"))
    assert files.read() is None
    assert open_under(tmp_path) == set()
    (directory / "rate").write_text("400 Gb/sec (4X NDR)\n")  # a new entry moves the stamp
    assert files.read() == (b"4: ACTIVE\n", b"400 Gb/sec (4X NDR)\n")


def gpu_tree(root: Path) -> Path:
    node_tree(root)
    for directory in (root / "bus" / "pci" / "devices").iterdir():
        settled(directory)
    return root / "bus" / "pci" / "devices" / GPU_ADDRESS


def test_the_pcie_source_holds_each_functions_five_files_and_closes_them(tmp_path: Path) -> None:
    gpu = gpu_tree(tmp_path)
    source = PcieSource(PcieSourceConfig(sysfs_root=str(tmp_path)))
    source.poll(T0)
    held = open_under(tmp_path)
    assert {path for path in held if GPU_ADDRESS in path} == {
        f"bus/pci/devices/{GPU_ADDRESS}/{name}"
        for name in (
            "aer_dev_correctable",
            "aer_dev_nonfatal",
            "aer_dev_fatal",
            "current_link_speed",
            "current_link_width",
        )
    }
    assert len(held) == 10  # the GPU's and the HCA's
    (gpu / "aer_dev_fatal").write_text(aer_file("TOTAL_ERR_FATAL", DLP=2))
    assert (source.poll(T0 + POLL).pcie_functions or ())[0].aer_errors["fatal"] == 2
    assert open_under(tmp_path) == held
    source.close()
    assert open_under(tmp_path) == set()


def test_the_pcie_source_reads_an_aer_file_renamed_over_a_held_one(tmp_path: Path) -> None:
    gpu = gpu_tree(tmp_path)
    source = PcieSource(PcieSourceConfig(sysfs_root=str(tmp_path)))
    assert (source.poll(T0).pcie_functions or ())[0].aer_errors["fatal"] == 0
    replaced(gpu / "aer_dev_fatal", aer_file("TOTAL_ERR_FATAL", DLP=1))
    gpu_function = (source.poll(T0 + POLL).pcie_functions or ())[0]
    assert gpu_function.aer_errors["fatal"] == 1 and gpu_function.aer_causes["fatal:DLP"] == 1


def test_the_pcie_source_sees_aer_files_removed_from_a_held_function(tmp_path: Path) -> None:
    gpu = gpu_tree(tmp_path)
    source = PcieSource(PcieSourceConfig(sysfs_root=str(tmp_path)))
    assert (source.poll(T0).pcie_functions or ())[0].aer_errors
    for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        (gpu / name).unlink()
    gpu_function = (source.poll(T0 + POLL).pcie_functions or ())[0]
    assert gpu_function.aer_errors == {} and gpu_function.link_width == 16


def test_the_pcie_source_reads_a_function_replaced_at_its_address_from_its_own_files(
    tmp_path: Path,
) -> None:
    """A GPU's function removed and another GPU's added at its address, both
    settled: the second's counts, never the first's."""
    gpu = gpu_tree(tmp_path)
    source = PcieSource(PcieSourceConfig(sysfs_root=str(tmp_path)))
    assert (source.poll(T0).pcie_functions or ())[0].aer_errors["nonfatal"] == 3
    plugged = function_dir(
        tmp_path / "plugged",
        GPU_ADDRESS,
        "0x10de",
        "0x030200",
        aer_dev_nonfatal=aer_file("TOTAL_ERR_NONFATAL", CmpltTO=9),
    )
    gpu.rename(tmp_path / "unplugged")
    settled(plugged).rename(gpu)
    assert (source.poll(T0 + POLL).pcie_functions or ())[0].aer_errors["nonfatal"] == 9
    assert not {path for path in open_under(tmp_path) if path.startswith("unplugged/")}
