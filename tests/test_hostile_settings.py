"""Hostile config and scenario files: every input either loads or is refused
with a message naming the file (never a traceback, a hang or gigabytes);
numbers are finite and bounded; YAML is read within limits of size, depth
and alias expansion. Fuzzed with hypothesis; each crash it found is a case."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatchd.config import Config
from gpuwatchd.settings import SettingsError, load, load_file
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.scenario import ScenarioError

BOMB = "\n".join(
    [
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]",
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("daemon: {poll_interval: .nan}", "finite number"),
        ("daemon: {poll_interval: .inf}", "finite number"),
        ("daemon: {poll_interval: 1ms}", "at least 0.1s"),
        ("daemon: {poll_interval: " + "9" * 400 + "}", "finite number"),
        ("policy: {confirm_for: .nan}", "finite number"),
        ("daemon: {poll_interval: !duration 10s}", "could not determine a constructor"),
        ("[" * 5000 + "]" * 5000, "nested deeper than"),
        (BOMB, "expands to more than"),
        ("daemon:\n  poll_interval: " + "x" * (2 << 20), "larger than"),
    ],
)
def test_a_hostile_config_is_refused_with_a_message(text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load(Config, text, "hostile.yaml")


def test_a_config_file_that_is_not_utf8_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatchd.yaml"
    path.write_bytes(b"daemon:\n  listen: \xff\xfe\n")
    with pytest.raises(SettingsError, match=r"gpuwatchd.yaml:2: \(top level\): not UTF-8"):
        load_file(Config, str(path))


NODE = "node: {gpus: 2, nvlinks: 2, hcas: 1}\n"


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{kind: clock_drift, gpu: 1, ratio: abc, at: 1s}", "ratio must be a number"),
        ("{kind: clock_drift, gpu: 1, ratio: [1], at: 1s}", "ratio must be a number"),
        ("{kind: [xid], gpu: 1, at: 1s}", "kind must be text"),
        ("{kind: xid, gpu: 1, code: 79, at: .nan}", "finite number"),
        ("{kind: nvlink_crc_storm, gpu: 1, link: 0, rate: " + "9" * 400 + "/s, at: 1s}", "finite"),
    ],
)
def test_a_hostile_scenario_fault_is_refused_with_a_message(fault: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenarios.parse(f"{NODE}faults: [{fault}]\n", "hostile.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"seed: {10**100}\n", "seed must be"),
        (f"{BOMB}\n", "expands to more than"),
        (NODE + "faults: [{kind: link_flap, hca: *x, at: 1s}]\n", "not valid YAML"),
        ("node: " + "[" * 5000 + "]" * 5000, "nested deeper"),
    ],
)
def test_a_hostile_scenario_is_refused_with_a_message(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenarios.parse(text, "hostile.yaml")


def test_a_scenario_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"node: {gpus: \xff}\n")
    with pytest.raises(ScenarioError, match="not UTF-8"):
        scenarios.load(str(path))


# Documents shaped like the real ones: the known keys, with values of every kind.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["10s", "500ms", "2h", "-5s", "1e400", "50/s", "nan", "0", "xid", "gpu:1"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.sampled_from(["at", "kind", "gpu"]), children)
    ),
    max_leaves=12,
)
CONFIG_KEYS = {
    "daemon": ["poll_interval", "listen", "history", "log_level", "state_dir"],
    "policy": ["confirm_for", "dry_run"],
    "api": ["max_body_bytes", "token_file"],
    "checks": ["thermal", "nvlink", "infiniband"],
    "sources": ["nvml", "infiniband"],
}
CONFIGS = st.dictionaries(
    st.sampled_from(sorted(CONFIG_KEYS)),
    st.dictionaries(
        st.sampled_from([key for keys in CONFIG_KEYS.values() for key in keys]), VALUES, max_size=3
    )
    | VALUES,
    max_size=3,
)
FAULT = st.fixed_dictionaries(
    {"kind": st.sampled_from(sorted(scenarios.FAULT_FIELDS)) | VALUES, "at": VALUES},
    optional={k: VALUES for k in ("gpu", "link", "hca", "port", "rate", "code", "ratio", "mode")},
)
SCENARIOS = st.fixed_dictionaries(
    {},
    optional={"node": VALUES, "seed": VALUES, "faults": st.lists(FAULT, max_size=3) | VALUES},
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(CONFIGS)
def test_any_config_document_loads_or_is_refused_with_a_message(document: object) -> None:
    try:
        load(Config, yaml.safe_dump(document), "fuzz.yaml")
    except SettingsError as error:
        assert str(error).startswith("fuzz.yaml")


@FUZZ
@given(st.text(max_size=200))
def test_any_text_as_config_loads_or_is_refused_with_a_message(text: str) -> None:
    try:
        load(Config, text, "fuzz.yaml")
    except SettingsError as error:
        assert str(error).startswith("fuzz.yaml")


@FUZZ
@given(SCENARIOS)
def test_any_scenario_document_parses_or_is_refused_with_a_message(document: object) -> None:
    try:
        scenarios.parse(yaml.safe_dump(document), "fuzz.yaml")
    except ScenarioError as error:
        assert str(error).startswith("fuzz.yaml")
