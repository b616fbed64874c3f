"""The config loader: typed, frozen, and errors that name file, line and key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatchd.cli import main
from gpuwatchd.config import Config, load_config, parse_config
from gpuwatchd.settings import SettingsError

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "config" / "gpuwatchd.yaml"


def test_empty_config_gives_the_defaults() -> None:
    assert parse_config("") == Config()


def test_shipped_config_loads_and_equals_the_defaults() -> None:
    # The documented file is the defaults written out: the two must not drift.
    assert load_config(str(SHIPPED)) == Config()


def _leaf_keys(settings: object, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        if dataclasses.is_dataclass(value):
            keys |= _leaf_keys(value, f"{prefix}{f.name}.")
        else:
            keys.add(f"{prefix}{f.name}")
    return keys


def test_shipped_config_documents_every_key_with_a_comment() -> None:
    text = SHIPPED.read_text()
    lines = text.splitlines()
    for key in sorted(_leaf_keys(Config())):
        leaf = key.rsplit(".", 1)[-1]
        positions = [i for i, line in enumerate(lines) if line.strip().startswith(f"{leaf}:")]
        assert positions, f"{key} is not in {SHIPPED.name}"
        commented = any(
            "#" in lines[i] or (i > 0 and lines[i - 1].strip().startswith("#")) for i in positions
        )
        assert commented, f"{key} has no comment in {SHIPPED.name}"


def test_unknown_key_names_file_line_and_key() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_config("daemon:\n  poll_interval: 5s\n  pol_interval: 5s\n", "node.yaml")
    assert str(caught.value).startswith("node.yaml:3: daemon.pol_interval: unknown key")


def test_wrong_type_names_the_key() -> None:
    with pytest.raises(
        SettingsError, match=r"x.yaml:3: sources.nvml.enabled: expected true or false"
    ):
        parse_config("sources:\n  nvml:\n    enabled: maybe\n", "x.yaml")


def test_bad_duration_is_rejected_with_its_line() -> None:
    with pytest.raises(SettingsError, match=r"x.yaml:2: daemon.poll_interval: expected a duration"):
        parse_config("daemon:\n  poll_interval: often\n", "x.yaml")


def test_bad_listen_address_is_rejected() -> None:
    with pytest.raises(SettingsError, match="listen must be HOST:PORT"):
        parse_config("daemon:\n  listen: localhost\n", "x.yaml")


def test_list_where_a_value_belongs_is_rejected() -> None:
    with pytest.raises(SettingsError, match="expected a single value"):
        parse_config("daemon:\n  state_dir: [a, b]\n", "x.yaml")


def test_durations_accept_units_and_config_is_frozen() -> None:
    config = parse_config("daemon: {poll_interval: 500ms, history: 2h}")
    assert config.daemon.poll_interval == 0.5
    assert config.daemon.history == 7200.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.daemon.poll_interval = 1.0  # type: ignore[misc]


def test_invalid_yaml_reports_the_line() -> None:
    with pytest.raises(SettingsError, match=r"x.yaml:2: .*not valid YAML"):
        parse_config("daemon:\n  - : [\n", "x.yaml")


def test_check_config_command_passes_a_good_file_and_names_a_bad_one(tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(main, ["check-config", str(SHIPPED)])
    assert good.exit_code == 0, good.output
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("daemon:\n  listen: 127.0.0.1:9477\n  colour: blue\n")
    bad = runner.invoke(main, ["check-config", str(bad_file)])
    assert bad.exit_code == 1
    assert f"{bad_file}:3: daemon.colour: unknown key" in bad.output


def test_check_config_on_a_missing_file_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["check-config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert "cannot read" in result.output


def test_a_duration_without_a_unit_is_refused_with_the_fix() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_config("daemon:\n  poll_interval: 10\n", "x.yaml")
    assert str(caught.value) == (
        "x.yaml:2: daemon.poll_interval: 10 has no unit: write 10s (or 500ms, 5m, 2h)"
    )
    # Zero needs no unit: it is zero in all of them.
    assert parse_config("checks: {memory: {window: 10m}}\npolicy: {confirm_for: 0}").policy


def test_a_history_shorter_than_a_check_window_is_refused_naming_the_window() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_config("daemon:\n  history: 1m\n", "x.yaml")
    assert str(caught.value) == (
        "x.yaml:2: daemon.history: daemon.history is 1m, shorter than "
        "checks.infiniband.flap_window (1h): that check could never see a full window"
    )


@pytest.mark.parametrize("scheduler", ["slurm", "kubernetes"])
def test_a_scheduler_with_fleet_safety_and_no_prometheus_is_refused(scheduler: str) -> None:
    text = f"actions:\n  {scheduler}:\n    enabled: true\n"
    with pytest.raises(SettingsError) as caught:
        parse_config(text, "x.yaml")
    message = str(caught.value)
    assert message.startswith(
        f"x.yaml:2: actions: fleet_safety.prometheus_url is required with {scheduler}"
    )
    # Any of the three ways out is accepted.
    url = "    prometheus_url: http://prometheus:9090\n"
    for fix in (url, "    enabled: false\n", "    fail_open: true\n"):
        parse_config(f"{text}  fleet_safety:\n{fix}")
    parse_config(f"{text}    dry_run: true\n")


def test_a_webhook_without_a_name_says_so_not_a_python_signature() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_config("actions:\n  webhooks:\n    - url: http://am:9093/\n", "x.yaml")
    assert str(caught.value) == "x.yaml:3: actions.webhooks[0]: name is required here"


def test_a_check_on_a_field_names_that_field_and_its_line() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_config("daemon:\n  listen: 127.0.0.1:1\n  log_level: loud\n", "x.yaml")
    assert str(caught.value).startswith("x.yaml:3: daemon.log_level: log_level must be debug")


def test_a_yaml_error_names_its_line_and_where_the_parser_was() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_config("daemon: {poll_interval: 10s,\n\npolicy: {}\n", "x.yaml")
    message = str(caught.value)
    assert "<unicode string>" not in message
    assert "while parsing a flow mapping at line 1" in message


def test_check_config_names_the_export_detail_modes_when_given_another(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("export:\n  detail: minimal\n")
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 1
    assert f"{config}:2: export.detail: must be one of 'full', 'compact', got 'minimal'" in (
        result.output
    )
    compact = parse_config("export: {detail: compact, canary_cores: all}\n").export
    assert compact.compact and compact.canary_cores == "all"


# Review adversarial-2, rows 316-358: extremes check-config accepted. Each is
# the review's file, run through check-config, refused with file:line: key.
@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("sources:\n  nvml:\n    kernel_log: kmsg\n", "3: sources.nvml.kernel_log", "absolute"),
        ("daemon:\n  journal_retention: 0\n", "2: daemon.journal_retention", "at least 1h"),
        (f"api:\n  max_body_bytes: {10**30}\n", "2: api.max_body_bytes", "at most 1048576"),
        (f"canary:\n  hbm_bytes: {10**30}\n", "2: canary.hbm_bytes", "0 to 1099511627776"),
        (f"canary:\n  min_free_bytes: {10**30}\n", "2: canary.min_free_bytes", "1 TiB"),
        (f"canary:\n  seed: {10**100}\n", "2: canary.seed", "seed must be 0 to 2^64-1"),
        ("canary:\n  seed: -1\n", "2: canary.seed", "seed must be 0 to 2^64-1"),
        (
            "checks:\n  nvlink:\n    effective_ber_critical: .nan\n",
            "3: checks.nvlink.effective_ber_critical",
            "expected a finite number, got nan",
        ),
        (
            "checks:\n  thermal:\n    hbm_max_celsius: .inf\n",
            "3: checks.thermal.hbm_max_celsius",
            "expected a finite number, got inf",
        ),
        (
            "checks:\n  thermal:\n    hbm_max_celsius: -1\n",
            "3: checks.thermal.hbm_max_celsius",
            "hbm_max_celsius must be more than 0",
        ),
        (
            "checks:\n  thermal:\n    cool_margin_celsius: -5\n",
            "3: checks.thermal.cool_margin_celsius",
            "cool_margin_celsius cannot be negative",
        ),
        (
            f"checks:\n  xid:\n    ignore: [{10**30}]\n",
            "3: checks.xid.ignore",
            "ignore holds XIDs, each 1 to 999",
        ),
        (
            "checks:\n  xid:\n    ignore: [0]\n",
            "3: checks.xid.ignore",
            "ignore holds XIDs, each 1 to 999",
        ),
        # More GPUs or links than a node or a GPU has: every one called short.
        (
            "checks:\n  gpu_lost:\n    expected_gpus: 100000\n",
            "3: checks.gpu_lost.expected_gpus",
            "expected_gpus must be 0 to 64",
        ),
        (
            "checks:\n  nvlink:\n    expected_links: 100\n",
            "3: checks.nvlink.expected_links",
            "expected_links must be 0 to 36",
        ),
        # A whole number too large for a double, where a number belongs.
        (
            f"policy:\n  node_quarantine_ratio: {10**400}\n",
            "2: policy.node_quarantine_ratio",
            "expected a finite number",
        ),
    ],
)
def test_check_config_refuses_an_extreme_value_naming_file_line_and_key(
    tmp_path: Path, text: str, key: str, message: str
) -> None:
    config = tmp_path / "extreme.yaml"
    config.write_text(text)
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 1, result.output
    assert f"{config}:{key}: " in result.output and message in result.output
    assert "Traceback" not in result.output


def test_the_bounds_keep_what_a_real_node_needs() -> None:
    config = parse_config(
        "daemon: {journal_retention: 1h}\n"
        "sources: {nvml: {kernel_log: /var/log/kern.log}}\n"
        "api: {max_body_bytes: 1048576}\n"
        f"canary: {{seed: {2**64 - 1}, hbm_bytes: 0, min_free_bytes: 0}}\n"
        "checks: {xid: {ignore: [1, 999]}, thermal: {hbm_max_celsius: 105}}\n"
    )
    assert config.canary.seed == 2**64 - 1 and config.checks.xid.ignore == (1, 999)
    assert config.daemon.journal_retention == 3600.0


def test_the_configuration_is_read_without_the_listener() -> None:
    # config reads the settings and server serves them: config never imports
    # the listener (the two once imported each other over ApiConfig).
    probe = "import sys, gpuwatchd.config; print('gpuwatchd.server' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert loaded.stdout.strip() == "False"
