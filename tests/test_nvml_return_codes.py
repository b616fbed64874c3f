"""Every NVML return code at every call the fake library can intercept, at
random (a fixed seed), for many polls of the whole daemon.

The daemon must keep polling with no exception escaping a poll, keep
rendering /metrics, and decide nothing definitive from an error code alone,
except where nvml.h gives the code that meaning: GPU_IS_LOST ("the GPU has
fallen off the bus") makes the GPU lost, RESET_REQUIRED ("the GPU requires a
reset before it can be used again") makes it need a reset.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path

import pynvml
import pytest
from daemon_support import SimulatedDaemon, simulated_daemon
from prometheus_client import generate_latest

from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sources import nvml as nvml_source

# Every return code nvidia-ml-py mirrors from nvml.h but success.
CODES = sorted(value for name, value in vars(pynvml).items() if name.startswith("NVML_ERROR_"))
# The codes nvml.h gives a meaning a decision may rest on, and what they
# decide (with the node's share of quarantined GPUs that follows).
MEANINGFUL = {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED}
DECIDED_BY_CODE = {"gpu_lost", "gpu_reset_required", "gpu_quarantine_ratio"}
# Every field value the source asks for, by the name it asks with.
FIELDS = sorted(
    {
        field_id
        for name in re.findall(r"NVML_FI_[A-Z0-9_]+", Path(nvml_source.__file__).read_text())
        if isinstance(field_id := getattr(pynvml, name, None), int)
    }
)
# nvmlErrorString makes the error's text, not a return code.
NOT_A_CALL_SITE = {"nvmlErrorString", "nvmlInitWithFlags", "nvmlShutdown"}
POLLS = 300
GPUS = 4
FAIL_SHARE = 0.15


def _scenario(model: str) -> str:
    return f'node: {{gpus: {GPUS}, model: "{model}", hcas: 0}}\nseed: 3\n'


def _fail_at_random(fake: FakeNvml, rng: random.Random, codes: list[int]) -> int:
    """Make a random share of (call, GPU) pairs and field values fail with a
    random code for the next poll; how many were made to fail."""
    fake.clear_failures()
    failed = 0
    functions = sorted(name for name in vars(fake.library) if name not in NOT_A_CALL_SITE)
    for function in functions:
        for gpu in (None, *range(GPUS)):
            if rng.random() < FAIL_SHARE / (GPUS + 1):
                fake.fail(rng.choice(codes), function, gpu)
                failed += 1
    for field_id in FIELDS:
        if rng.random() < FAIL_SHARE:
            fake.fail_field(field_id, rng.choice(codes), rng.choice((None, *range(GPUS))))
            failed += 1
    return failed


def _run(sim: SimulatedDaemon, codes: list[int], seed: int) -> tuple[int, set[str]]:
    """Poll POLLS times under random failures; (failures made, codes of
    the automatic quarantines decided)."""
    rng = random.Random(seed)
    fake = sim.node.nvml
    failed = 0
    interval = sim.daemon.config.daemon.poll_interval
    for poll in range(POLLS):
        failed += _fail_at_random(fake, rng, codes)
        snapshot = sim.daemon.step()
        sim.clock.advance(interval)
        assert snapshot.source_up.get("nvml") is True, snapshot.source_errors
        assert not snapshot.check_errors
        assert len(snapshot.gpus) == GPUS
        if poll % 25 == 0:
            assert b"gpuwatchd_gpu_up" in generate_latest(sim.daemon.registry)
    fake.clear_failures()
    entries = sim.daemon.store.journal.entries(since=0, limit=10_000)
    decided = {e.code or "" for e in entries if e.kind == "quarantine" and e.source == "auto"}
    return failed, decided


@pytest.mark.parametrize("model", ["NVIDIA H100 80GB HBM3", "NVIDIA B200", "Tesla V100-SXM2-32GB"])
def test_random_error_codes_at_every_call_decide_nothing(
    model: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    codes = [code for code in CODES if code not in MEANINGFUL]
    with caplog.at_level(logging.WARNING), simulated_daemon(_scenario(model), tmp_path) as sim:
        failed, decided = _run(sim, codes, seed=12)
        quarantines = sim.daemon.snapshot.quarantines
    assert failed > POLLS * 5
    assert decided == set() and quarantines == ()
    assert not [r for r in caplog.records if r.exc_info], "an exception was logged"


def test_lost_and_reset_required_are_the_only_codes_that_decide(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING),
        simulated_daemon(_scenario("NVIDIA H100 80GB HBM3"), tmp_path) as sim,
    ):
        failed, decided = _run(sim, CODES, seed=13)
    assert failed > POLLS * 5
    assert decided and decided <= DECIDED_BY_CODE
    assert not [r for r in caplog.records if r.exc_info], "an exception was logged"
