"""History: bounded per subject, and spanning its whole age at any poll interval."""

from __future__ import annotations

import pytest
from gpu_history import T0, gpu, record

from gpuwatchd.history import History


@pytest.mark.parametrize("interval", [0.1, 0.5, 1.0, 10.0])
def test_the_history_spans_its_age_in_at_most_its_samples_at_any_poll_interval(
    interval: float,
) -> None:
    history = History(max_age_seconds=3600.0)
    polls = int(4200 / interval)
    for k in range(polls):
        record(history, T0 + k * interval, [gpu(0, power_watts=float(k))])
    now = T0 + (polls - 1) * interval
    samples = history.gpu(0)
    assert len(samples) <= history.max_samples
    assert samples[0][0] <= now - 3600.0 <= samples[1][0]
    # The newest sample is the last poll's, whatever was thinned before it.
    assert samples[-1] == (now, gpu(0, power_watts=float(polls - 1)))
    if interval >= 1.0:
        # Nothing is thinned where the samples fit.
        assert [t for t, _ in samples] == [now - interval * k for k in range(len(samples))][::-1]
