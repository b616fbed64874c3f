"""Recall of intermittent GPU faults under the real confirmation and
schedule code: a Monte Carlo over canary.confirm and canary.schedule.

One GPU of an 8-GPU node is faulty: each of its bursts (and each re-run on
it) shows a mismatch with probability p, on a canary drawn at random from
the suite (the full-mantissa GEMMs' digests among them: a lead like any
other), independently of the others (an intermittent fault; the
trigger probability p lumps together what the suite's content and the
GPU's conditions do to trigger it, which no simulation can know). The
sibling computes the same inputs right. The GPU is idle (bursts every
`interval`, watched ones every `watch_interval`) or busy (`when: always`,
bursts aligned to wall-clock slots, within the duty budget, each charged
`--device-seconds`: what the GPU spent, as the events of a real burst
measure it; 0.04 s is the estimate for an idle H100, docs/sdc.md). Re-runs
finish at the next poll and are not charged.

Prints, per cell, the share of trials in which the GPU is confirmed
(`sdc_confirmed`) within the horizon, with a 95 % Wilson interval, and the
median time to confirmation among the confirmed trials. It measures the
schedule and the confirmation rules only: what p is for a real defect is
outside any simulation (docs/sdc.md, "Recall").

    .venv/bin/python bench/sdc_recall.py [--trials 200] [--days 7 30] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass

from gpuwatchd.canary import schedule
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.confirm import ConfirmState, findings, observe, observe_rerun
from gpuwatchd.canary.result import CanaryResult, Outcome
from gpuwatchd.canary.spec import CanarySpec, default_suite

POLL = 10.0
# Eight GPUs of one model: each the others' peer.
GPUS = dict.fromkeys((f"gpu:{i}" for i in range(8)), "NVIDIA H100 80GB HBM3, 132 SMs")
SUSPECT = "gpu:3"
CANARIES = list(default_suite("cuda", 1, 1, 1 << 28))


@dataclass(frozen=True)
class Cell:
    p: float
    busy: bool
    days: float


def _result(target: str, outcome: Outcome, spec: CanarySpec, seed: int) -> CanaryResult:
    return CanaryResult(
        canary=spec.name,
        kind=spec.kind,
        dtype=spec.dtype,
        seed=seed,
        shape=spec.shape,
        result=outcome,
        duration_seconds=0.1,
        gpu=int(target.split(":")[1]),
        uuid=f"GPU-{target.split(':')[1]}",
        mismatch_count=1 if outcome == "mismatch" else 0,
    )


def trial(cell: Cell, config: CanaryConfig, device_seconds: float, rng: random.Random) -> float:
    """Seconds to confirmation, or inf."""
    state, plan = ConfirmState(), schedule.ScheduleState()
    horizon = cell.days * 86400.0
    now = rng.uniform(0, config.interval)  # the daemon starts at any time
    bursts = 0
    while now < horizon:
        watched = state.watched(now)
        idle = {SUSPECT: not cell.busy}
        if not schedule.due(config, plan, now, idle, watched):
            now += POLL
            continue
        plan = schedule.started(plan, SUSPECT, now, idle[SUSPECT])
        plan = schedule.finished(config, plan, SUSPECT, now + 1.0, device_seconds)
        seed = config.seed + bursts % config.seed_rotation
        bursts += 1
        if rng.random() >= cell.p:
            state, _ = observe(state, [], now, config, GPUS)
            now += POLL
            continue
        lead = _result(SUSPECT, "mismatch", rng.choice(CANARIES), seed)
        state, reruns = observe(state, [lead], now, config, GPUS)
        for rerun in reruns:
            outcome: Outcome = "pass"
            if rerun.target == SUSPECT and rng.random() < cell.p:
                outcome = "mismatch"
            answers = [_result(rerun.target, outcome, spec, spec.seed) for spec in rerun.specs]
            state, _ = observe_rerun(state, rerun, answers, now + POLL, config, GPUS)
        if any(f.code == "sdc_confirmed" for f in findings(state, now + POLL)):
            return now + POLL
        now += POLL
    return math.inf


def wilson(successes: int, trials: int) -> tuple[float, float]:
    z = 1.96
    share = successes / trials
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials))
    half /= 1 + z * z / trials
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> None:
    # The first paragraph: its first line alone ends mid-sentence.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials a cell (default 200)")
    parser.add_argument(
        "--days", type=float, nargs="+", default=[7.0, 30.0], help="horizons in days (default 7 30)"
    )
    parser.add_argument(
        "--p",
        type=float,
        nargs="+",
        default=[0.1, 0.01, 0.003, 0.001, 0.0003],
        help="chances that a burst on the faulty GPU mismatches "
        "(default 0.1 0.01 0.003 0.001 0.0003)",
    )
    parser.add_argument(
        "--device-seconds",
        type=float,
        default=0.04,
        help="device time a burst is charged on a busy GPU (default 0.04)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    args = parser.parse_args()
    config = CanaryConfig()
    rng = random.Random(args.seed)
    print("| p per burst | GPU | days | confirmed | 95 % interval | median days to confirm |")
    print("|---|---|---|---|---|---|")
    for days in args.days:
        for p in args.p:
            for busy in (False, True):
                cell = Cell(p, busy, days)
                times = [trial(cell, config, args.device_seconds, rng) for _ in range(args.trials)]
                hits = [t for t in times if t < math.inf]
                low, high = wilson(len(hits), args.trials)
                median = f"{statistics.median(hits) / 86400:.2f}" if hits else "-"
                print(
                    f"| {p:g} | {'busy' if busy else 'idle'} | {days:g} | "
                    f"{len(hits) / args.trials:.0%} | {low:.0%}-{high:.0%} | {median} |"
                )


if __name__ == "__main__":
    main()
