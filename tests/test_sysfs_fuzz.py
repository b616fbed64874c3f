"""The InfiniBand sysfs parsers and reader against garbage (hypothesis).

Any text is parsed into a value in range or refused with ValueError; any
bytes in any file of a port leave the reader running, every value it keeps in
range, /metrics rendering, and each garbage file said once, not every poll.
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_infiniband_source import make_port, render

from gpuwatchd.daemon import _boot_id as daemon_boot_id
from gpuwatchd.sources import InfinibandSourceConfig
from gpuwatchd.sources.infiniband import (
    MAX_RATE_GBPS,
    MAX_STATE,
    U64_MAX,
    InfinibandSource,
    parse_counter,
    parse_rate,
    parse_state,
    port_number,
)
from gpuwatchd.store import read_boot_id

# Text shaped like sysfs values, and anything else.
SYSFS_LIKE = st.one_of(
    st.text(),
    st.from_regex(r"\s*-?[0-9]{0,500}(\.[0-9]*)?\s*(:\s*\w*)?\s*(G[bB]/sec)?.*", fullmatch=True),
    st.builds(lambda n: str(n), st.integers(min_value=-(2**70), max_value=2**70)),
)
FUZZ = settings(max_examples=400, deadline=None)


@FUZZ
@given(SYSFS_LIKE)
def test_any_counter_text_is_a_u64_or_refused(text: str) -> None:
    try:
        value = parse_counter(text)
    except ValueError:
        return
    assert 0 <= value <= U64_MAX


@FUZZ
@given(SYSFS_LIKE)
def test_any_rate_text_is_a_finite_link_rate_or_refused(text: str) -> None:
    try:
        value = parse_rate(text)
    except ValueError:
        return
    assert math.isfinite(value) and 0 <= value <= MAX_RATE_GBPS * 125_000_000


@FUZZ
@given(SYSFS_LIKE)
def test_any_state_text_is_a_u8_state_number_or_refused(text: str) -> None:
    try:
        number, name = parse_state(text)
    except ValueError:
        return
    assert 0 <= number <= MAX_STATE and name.strip() == name and name


@FUZZ
@given(st.text())
def test_any_ports_entry_is_a_port_number_or_passed_over(entry: str) -> None:
    number = port_number(entry)
    assert number is None or 0 <= number < 100_000


PORT_FILES = ("state", "phys_state", "rate", "link_layer", "counters/symbol_error")
GARBAGE = st.one_of(
    st.binary(max_size=300),
    SYSFS_LIKE.map(lambda text: text.encode("utf-8", "surrogatepass")),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files=st.dictionaries(st.sampled_from(PORT_FILES), GARBAGE, min_size=1))
def test_garbage_in_any_port_file_is_absent_said_once_and_metrics_render(
    files: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("sysfs")
    port_dir = make_port(root)
    for name, data in files.items():
        (port_dir / name).write_bytes(data)
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(root)))
    logger = logging.getLogger("gpuwatchd.sources.infiniband")
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    logger.addHandler(handler)
    try:
        readings = [source.poll(float(n)) for n in range(3)]
    finally:
        logger.removeHandler(handler)
    for reading in readings:
        assert reading.ports is not None and len(reading.ports) == 1
        port = reading.ports[0]
        values = [*port.counters.values(), *port.hw_counters.values()]
        assert all(0 <= value <= U64_MAX * 4 for value in values)
        for number in (port.state_id, port.physical_state_id):
            assert number is None or 0 <= number <= MAX_STATE
        rate = port.rate_bytes_per_second
        assert rate is None or (math.isfinite(rate) and rate >= 0)
        metrics = render(reading)
        assert ("gpuwatchd_infiniband_state_id{" in metrics) == (port.state_id is not None)
    said = [record.getMessage() for record in records]
    for name in files:
        about = [message for message in said if f"{port_dir / name}:" in message]
        assert len(about) <= 1, about


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self._records = records

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)


def test_a_port_file_of_bytes_that_are_not_utf8_is_absent_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port_dir = make_port(tmp_path)
    (port_dir / "counters" / "symbol_error").write_bytes(b"\xff\xfe12")
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    with caplog.at_level(logging.INFO):
        reading = source.poll(0.0)
    assert reading.ports is not None
    assert "symbol_error" not in reading.ports[0].counters
    assert any("symbol_error: not a number" in r.getMessage() for r in caplog.records)


def test_a_400_digit_port_state_is_absent_and_metrics_render(tmp_path: Path) -> None:
    # Found by the fuzzing above: the state number went into a float on
    # /metrics, which a 400-digit number overflows.
    port_dir = make_port(tmp_path)
    (port_dir / "state").write_text("9" * 400 + ": ACTIVE\n")
    reading = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path))).poll(0.0)
    assert reading.ports is not None and reading.ports[0].state_id is None
    assert "gpuwatchd_infiniband_physical_state_id{" in render(reading)


@FUZZ
@given(st.binary(max_size=200))
def test_any_boot_id_file_is_an_id_or_refused_and_the_daemon_reads_on(data: bytes) -> None:
    with tempfile.NamedTemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        try:
            boot_id = read_boot_id(handle.name)
        except ValueError:
            boot_id = None
        else:
            assert boot_id.isascii() and 0 < len(boot_id) <= 64
        assert daemon_boot_id(handle.name) == (boot_id or "unknown")
