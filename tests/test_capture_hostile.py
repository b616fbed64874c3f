"""Hostile captures (review adversarial-2, rows 251-267): a capture is data
from elsewhere, so a scenario on one (`node: {capture: FILE}`) refuses any
file that is not a capture of the shape replay reads, with one message naming
the file and the place, never a traceback; replay writes nothing outside the
simulated sysfs tree; and `gpuwatchd capture` copies nothing from outside the
tree it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatchd import capture, capture_file
from gpuwatchd.cli import main
from gpuwatchd.clock import FakeClock
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.infiniband import SimulatedFabric
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.sim.replay import CapturedFabric
from gpuwatchd.sim.scenario import ScenarioError
from gpuwatchd.sources import InfinibandSourceConfig, NvmlSourceConfig
from gpuwatchd.sources.infiniband import InfinibandSource
from gpuwatchd.sources.nvml import NvmlSource

FIXTURE = Path(__file__).parent / "fixtures" / "h100-2gpu-fake.capture.json"

Document = dict[str, Any]


def _fixture() -> Document:
    document: Document = json.loads(FIXTURE.read_text())
    return document


def _call(document: Document, function: str, gpu: int = 0) -> dict[str, Any]:
    gpus = document["nvml"]["gpus"]
    call: dict[str, Any] = next(c for c in gpus[gpu]["calls"] if c["function"] == function)
    return call


def _scenario_on(tmp_path: Path, text: str) -> Path:
    """A scenario file on a capture file holding `text`."""
    (tmp_path / "hostile.capture.json").write_text(text)
    scenario = tmp_path / "hostile.yaml"
    scenario.write_text("node: {capture: hostile.capture.json}\n")
    return scenario


def _refused(tmp_path: Path, text: str, message: str) -> None:
    scenario = _scenario_on(tmp_path, text)
    with pytest.raises(ScenarioError) as caught:
        scenarios.load(str(scenario))
    assert f"{scenario}: node: {tmp_path / 'hostile.capture.json'}: " in str(caught.value)
    assert message in str(caught.value)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Document], None]:
    def change(document: Document) -> None:
        holder = document
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value

    return change


def _answer(function: str, answer: Any) -> Callable[[Document], None]:
    def change(document: Document) -> None:
        _call(document, function)["answers"] = [answer]

    return change


GPU0 = ("nvml", "gpus", 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # Row 256.
        (
            _set((*GPU0, "index"), "x"),
            "nvml.gpus[0].index: expected a whole number 0 to 63, got 'x'",
        ),
        # Row 257.
        (_set(("nvml", "gpus"), {"0": {}}), "nvml.gpus: expected a list, got a dict"),
        # Row 258.
        (_set((*GPU0, "calls"), 5), "nvml.gpus[0].calls: expected a list, got 5"),
        # Row 259.
        (_set((*GPU0, "calls", 0, "answers"), "x"), "calls[0].answers: expected a list, got 'x'"),
        # Row 260.
        (
            _answer("nvmlDeviceGetName", {"value": {"name": "H100"}}),
            ".value: expected text of at most 96 characters, got a dict",
        ),
        # Row 262 held (it ran): a return code of 10^30 is now refused as one.
        (_set((*GPU0, "calls", 0, "answers"), [{"return": 10**30}]), "does not fit in 64 bits"),
        (
            _set((*GPU0, "calls", 0, "answers"), [{"return": 1000}]),
            "expected a whole number 0 to 999",
        ),
        # Row 263.
        (
            _set(("infiniband", "files", "mlx5_0/board_id"), {"text": ["MT_0000000838"]}),
            "infiniband.files['mlx5_0/board_id'].text: expected text, got a list",
        ),
        # Shapes the review did not try, each of which replay would have met.
        (_set((*GPU0, "index"), 1), "nvml.gpus: the indices must be 0 to N-1, each once"),
        (
            _answer("nvmlDeviceGetTemperatureThreshold", {"value": 95.5}),
            "expected a whole number 0 to 4294967295, got 95.5",
        ),
        (_answer("nvmlDeviceGetRemappedRows", {"value": [0, 0]}), "expected 4 values, got 2"),
        (_answer("nvmlDeviceGetViolationStatus", {"value": {}}), "violationTime is missing"),
        (_answer("nvmlDeviceGetUUID", {"return": 0}), "an answer is a value or a return code"),
        (
            _answer("nvmlDeviceGetPciInfo_v3", {"value": {"busId": "0" * 33}}),
            ".value.busId: expected text such as 00000000:18:00.0",
        ),
        (
            _set(("nvml", "system", 6, "answers"), [{"value": "latest"}]),
            "nvml.system[6].answers[0].value: expected text such as 550.54.15, got 'latest'",
        ),
        (
            _set((*GPU0, "calls", 0, "args"), [2**63]),
            "calls[0].args[0]: expected a whole number -2147483648 to 4294967295",
        ),
        (
            _set((*GPU0, "calls", 0, "function"), "__class__"),
            ".function: expected an NVML function's name",
        ),
        (
            _set((*GPU0, "calls"), [{"function": "nvmlDeviceGetNvLinkState", "args": [10**6]}]),
            ".args[0]: expected a whole number 0 to",
        ),
        (
            _set((*GPU0, "fields", 0, "answers"), [{"return": 0, "value": [1]}]),
            "fields[0].answers[0].value: expected a number, got a list",
        ),
        (
            _set(("infiniband", "files", "mlx5_0/board_id/x"), {"text": "1"}),
            "infiniband.files['mlx5_0/board_id']: both a file and a folder",
        ),
        (
            _set(("infiniband", "files", "mlx5_0/bo\x00rd"), {"text": "1"}),
            "a name must be printable text",
        ),
        (_set(("infiniband", "files", "mlx5_0//x"), {"text": "1"}), "an empty name in a path"),
        (_set(("infiniband", "folders", "."), {"errno": "EIO"}), "folders['.'].errno"),
    ],
)
def test_a_capture_of_the_wrong_shape_is_one_message_naming_the_file_and_the_place(
    tmp_path: Path, change: Callable[[Document], None], message: str
) -> None:
    document = _fixture()
    change(document)
    _refused(tmp_path, capture.dumps(document), message)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # Row 261: a temperature of 1e400 (infinity to json) and of NaN.
        ("1e400", "'1e400' is too large for a double"),
        ("NaN", "NaN is not a value a capture holds"),
        ("-Infinity", "-Infinity is not a value a capture holds"),
        # Row 264.
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 32 levels"),
        # Row 265 (held): 10^5000 is more digits than Python parses.
        ("1" + "0" * 5000, "Exceeds the limit (4300 digits)"),
    ],
)
def test_a_capture_holding_a_number_json_cannot_hold_or_deep_nesting_is_refused(
    tmp_path: Path, raw: str, message: str
) -> None:
    document = _fixture()
    _answer("nvmlDeviceGetTemperatureThreshold", {"value": "RAW"})(document)
    text = capture.dumps(document).replace('"RAW"', raw, 1)
    _refused(tmp_path, text, message)


def test_a_capture_of_2000_gpus_is_refused_before_any_is_built(tmp_path: Path) -> None:
    """Row 267: NVML numbers a node's GPUs; no node has 2000 of them."""
    document = _fixture()
    gpu = {"calls": [], "fields": []}
    document["nvml"]["gpus"] = [{"index": index, **gpu} for index in range(2000)]
    _refused(tmp_path, capture.dumps(document), "nvml.gpus: more than 64 entries")


def test_a_capture_that_is_a_device_a_fifo_or_too_large_is_refused_unread(tmp_path: Path) -> None:
    """Row 255: /dev/zero was read until MemoryError."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opened for reading with no writer: a plain open would hang
    large = tmp_path / "large.json"
    with large.open("wb") as handle:
        handle.truncate(capture_file.MAX_BYTES + 1)  # sparse: nothing to read
    for path, message in (
        ("/dev/zero", "/dev/zero: not a regular file"),
        (str(fifo), "fifo.json: not a regular file"),
        (str(large), f"large.json: larger than {capture_file.MAX_BYTES} bytes"),
    ):
        scenario = tmp_path / "device.yaml"
        scenario.write_text(f"node: {{capture: {path}}}\n")
        with pytest.raises(ScenarioError, match=message):
            scenarios.load(str(scenario))


def test_infiniband_paths_out_of_the_tree_are_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    """Row 253 (high): `../` and absolute keys wrote the capture's text
    anywhere the daemon's user could write."""
    target = tmp_path / "outside"
    target.mkdir()
    climb = "../" * 12
    for key, message in (
        (f"{climb}{target}/traversal-PWNED.txt".replace("//", "/"), "'..' in a path"),
        (f"{target}/absolute-PWNED.txt", "an absolute path"),
    ):
        document = _fixture()
        document["infiniband"]["files"][key] = {"text": "written by a capture"}
        _refused(tmp_path, capture.dumps(document), message)
        # As the review ran it: the daemon on that scenario.
        scenario = tmp_path / "hostile.yaml"
        result = CliRunner().invoke(
            main, ["run", "--simulate", str(scenario), "--state-dir", str(tmp_path / "state")]
        )
        assert result.exit_code == 1 and message in result.output
        assert "Traceback" not in result.output
    assert list(target.iterdir()) == []


def test_the_replay_writes_through_no_symlink_and_no_dot_dot(tmp_path: Path) -> None:
    """The replay's own guard, below the capture's check: a tree given to it
    with a symlink on the way, or a path it was handed unchecked."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "board_id").write_text("kept\n")
    cases = {
        "folder": ("mlx5_0", outside, "mlx5_0/board_id"),
        "file": ("mlx5_1/board_id", outside / "board_id", "mlx5_1/board_id"),
        "dotdot": (None, None, "../../../outside/board_id"),
    }
    for name, (link, to, key) in cases.items():
        root = tmp_path / name
        class_dir = root / "class" / "infiniband"
        class_dir.mkdir(parents=True)
        if link is not None and to is not None:
            (class_dir / link).parent.mkdir(parents=True, exist_ok=True)
            (class_dir / link).symlink_to(to)
        with pytest.raises(ScenarioError, match="leads out of the simulated sysfs tree"):
            CapturedFabric({"present": True, "files": {key: {"text": "pwned"}}}, root, "c.json")
    assert sorted(path.name for path in outside.iterdir()) == ["board_id"]
    assert (outside / "board_id").read_text() == "kept\n"


def test_capture_copies_no_file_a_symlink_leads_to_outside_the_tree(tmp_path: Path) -> None:
    """Row 251: hw_counters/shadow, a symlink to a file outside the tree, was
    captured with that file's text. It is left out now, and said once."""
    tree = tmp_path / "sysfs"
    SimulatedFabric(scenarios.parse("node: {gpus: 1, hcas: 2}\n", "ib"), tree, FakeClock().now())
    secret = tmp_path / "secret.txt"
    secret.write_text("root:$6$not-for-a-capture\n")
    counters = tree / "class/infiniband/mlx5_1/ports/1/hw_counters"
    (counters / "shadow").symlink_to(secret)
    # The real sysfs links each HCA to its PCI device inside the tree: followed.
    (tree / "devices").mkdir()
    (tree / "class/infiniband/mlx5_0").rename(tree / "devices/mlx5_0")
    (tree / "class/infiniband/mlx5_0").symlink_to("../../devices/mlx5_0")
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("sources: {nvml: {enabled: false}}\n")
    out = tmp_path / "node.capture.json"
    result = CliRunner().invoke(
        main,
        ["capture", "--config", str(config), "--sysfs-root", str(tree), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "not-for-a-capture" not in text and "shadow" not in text
    files = capture_file.load(out)["infiniband"]["files"]
    assert "mlx5_0/board_id" in files and "mlx5_1/ports/1/hw_counters/lifespan" in files
    said = [line for line in result.stderr.splitlines() if "left out of the capture" in line]
    assert len(said) == 1 and "mlx5_1/ports/1/hw_counters/shadow" in said[0]


def test_a_capture_larger_than_a_scenario_still_runs_by_itself(tmp_path: Path) -> None:
    """`run --simulate FILE` reads a capture within its own 32 MiB, not a
    scenario's 1 MiB (a capture of a large node is larger than any scenario)."""
    document = _fixture()
    document["padding"] = "x" * (2 << 20)
    path = tmp_path / "large.capture.json"
    path.write_text(capture.dumps(document))
    shape = scenarios.load(str(path)).node
    assert (shape.gpus, shape.capture) == (2, str(path))


def test_a_number_where_a_call_takes_a_pointer_is_not_asked_back(tmp_path: Path) -> None:
    """Found by probing every binding function with a capture's numbers: the
    binding passes some arguments through as pointers (the struct of
    nvmlDeviceGetGpuFabricInfo), so a number there made the library write
    at that address, and the replay died of SIGSEGV. Run apart, so that a
    regression fails this test, not the whole run."""
    document = _fixture()
    document["nvml"]["gpus"][0]["calls"].append(
        {"function": "nvmlDeviceGetGpuFabricInfo", "args": [4096], "answers": [{"value": 0}]}
    )
    path = tmp_path / "pointer.capture.json"
    path.write_text(capture.dumps(document))
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from gpuwatchd.sim import scenario\n"
        "from gpuwatchd.sim.node import SimulatedNode\n"
        "node = SimulatedNode(scenario.load(sys.argv[1]), Path(sys.argv[2]), 0.0)\n"
        "print(*node.captured.differences, sep='\\n')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, str(path), str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "nvmlDeviceGetGpuFabricInfo(4096,): captured 0, served not asked" in result.stdout


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [path] + [p for key, item in value.items() for p in _leaves(item, (*path, key))]
    if isinstance(value, list):
        return [path] + [p for i, item in enumerate(value) for p in _leaves(item, (*path, i))]
    return [path]


# Changes to the committed capture: any part replaced by any JSON value, or an
# InfiniBand file added under any name.
LEAVES = [path for path in _leaves(_fixture()) if path]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from([0, 1, 17, 35, 36, 63, 64, 999, 2**32 - 1, 2**64 - 1, "", "550.1"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
NEW_FILES = st.text(max_size=30).map(lambda name: ("infiniband", "files", name))
CHANGES = st.lists(
    st.tuples(st.sampled_from(LEAVES), JSON_VALUES) | st.tuples(NEW_FILES, st.just({"text": "1"})),
    min_size=1,
    max_size=4,
)


def _apply(document: Document, path: tuple[Any, ...], value: Any) -> None:
    """Set the part at `path` (or a new key there) to `value`, where the
    changes before left that path."""
    holder: Any = document
    for key in path[:-1]:
        if not _has(holder, key):
            return
        holder = holder[key]
    if isinstance(holder, dict) or _has(holder, path[-1]):
        holder[path[-1]] = value


def _has(holder: Any, key: Any) -> bool:
    if isinstance(holder, dict):
        return key in holder
    return isinstance(holder, list) and isinstance(key, int) and 0 <= key < len(holder)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHANGES)
def test_any_change_to_a_capture_replays_or_is_refused_with_a_message(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    document = _fixture()
    for path, value in changes:
        _apply(document, path, value)
    with tempfile.TemporaryDirectory(prefix="capture-fuzz-") as folder:
        capture_path = Path(folder) / "fuzzed.capture.json"
        capture_path.write_text(capture.dumps(document))
        try:
            scenario = scenarios.load(str(capture_path))
        except ScenarioError as error:
            assert str(error).startswith(f"{capture_path}: ")
            return
        clock = FakeClock()
        root = Path(folder) / "root"
        node = SimulatedNode(scenario, root, clock.now()).install()
        try:
            node.advance(clock.now())
            source = NvmlSource(clock, NvmlSourceConfig(kernel_log=None), xid_thread=False)
            source.poll(clock.now())
            source.close()
        finally:
            node.uninstall()
        InfinibandSource(InfinibandSourceConfig(sysfs_root=str(root))).poll(clock.now())
        assert sorted(p.name for p in Path(folder).iterdir()) == ["fuzzed.capture.json", "root"]
