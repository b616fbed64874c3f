"""History's tracks: the windows and running totals checks read must give what
the counter maths gives over the same samples, however the track was fed
(samples replaced at the same time, expired, a column first asked for late),
and whether it keeps its samples whole or as columns (read back when asked)."""

from __future__ import annotations

import math
import tracemalloc
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatchd import columns, history
from gpuwatchd.checks.common import tail_from
from gpuwatchd.columns import SampleColumns
from gpuwatchd.counters import gauge_integral, increase, window
from gpuwatchd.history import Track, series


@dataclass(frozen=True)
class _Sample:
    value: int | float | None


def _value(sample: _Sample) -> int | float | None:
    return sample.value


def _track(max_samples: int, as_columns: bool) -> Track[_Sample]:
    """A track keeping every sample whole, or all as columns and the latest whole."""
    if as_columns:
        return Track(max_samples=max_samples, columns=SampleColumns(_Sample))
    return Track(max_samples=max_samples)


BITS = 8
values = st.one_of(
    st.none(),
    st.integers(min_value=0, max_value=2**BITS - 1),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
# Each step: a value, whether it replaces the last sample (same time), and
# whether a check reads the track after it.
steps = st.lists(st.tuples(values, st.booleans(), st.booleans()), min_size=1, max_size=40)


def _feed(track: Track[_Sample], plan: list[tuple[int | float | None, bool, bool]]) -> None:
    time = 0.0
    for value, same_time, read in plan:
        time += 0 if same_time and track.times else 10
        track.append(time, _Sample(value))
        track.expire(time - 150)
        if read:
            track.column("value", _value, BITS)
            track.area("value", _value)
            track.last_change("value", _value)
            track.gauge("value", _value)


@settings(derandomize=True, max_examples=300)
@given(
    steps,
    st.floats(min_value=-20, max_value=500),
    st.floats(min_value=0, max_value=200),
    st.booleans(),
)
def test_column_increase_matches_the_counter_maths_over_any_window(
    plan: list[tuple[int | float | None, bool, bool]], end: float, seconds: float, as_columns: bool
) -> None:
    track = _track(12, as_columns)
    _feed(track, plan)
    column = track.column("value", _value, BITS)
    points = series(track.items(), _value)
    start = end - seconds
    between = column.increase(track.at_or_before(start), track.upto(end), track.times)
    assert between == increase([(t, v) for t, v in tail_from(points, start) if t <= end], bits=BITS)
    latest = track.times[-1]
    first = track.before(latest - seconds)
    recent = column.increase(first, len(track) - 1, track.times)
    assert recent == increase(window(points, latest, seconds), bits=BITS)
    area = track.area("value", _value).integral(first, len(track) - 1)
    assert area == gauge_integral(window(points, latest, seconds))


@pytest.mark.parametrize("as_columns", [False, True])
def test_a_long_running_track_gives_what_its_samples_give_after_many_expire(
    as_columns: bool,
) -> None:
    # Long enough that what the track derived drops expired samples in batches.
    track = _track(4096, as_columns)
    for step in range(1000):
        time = step * 10.0
        value = None if step % 37 == 0 else (step * 7) % 250 + (step % 3) * 0.5
        track.append(time, _Sample(value))
        track.expire(time - 3600)
        column = track.column("value", _value, BITS)
        points = series(track.items(), _value)
        first = track.before(time - 600)
        assert column.increase(first, len(track) - 1, track.times) == increase(
            window(points, time, 600), bits=BITS
        )
        assert track.area("value", _value).integral(first, len(track) - 1) == gauge_integral(
            window(points, time, 600)
        )
        recent = [value for _, value in window(points, time, 600)[1:] if value is not None]
        gauge = track.gauge("value", _value)
        assert gauge.total(first + 1, len(track) - 1) == math.fsum(recent)
        assert gauge.count(first + 1, len(track) - 1) == len(recent)


# Whole floats past 2**53 and ints past what a float holds exactly, whose
# running float sum would round where fsum does not.
gauge_values = st.one_of(
    st.none(),
    st.integers(min_value=-(2**62), max_value=2**62),
    st.integers(min_value=-(2**60), max_value=2**60).map(float),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
)
gauge_steps = st.lists(
    st.tuples(gauge_values, st.booleans(), st.booleans()), min_size=1, max_size=40
)


@settings(derandomize=True, max_examples=300)
@given(
    gauge_steps,
    st.floats(min_value=-20, max_value=500),
    st.floats(min_value=0, max_value=200),
    st.booleans(),
)
def test_gauge_gives_the_fsum_count_and_last_value_of_any_window(
    plan: list[tuple[int | float | None, bool, bool]], end: float, seconds: float, as_columns: bool
) -> None:
    track = _track(12, as_columns)
    _feed(track, plan)
    first, last = track.span(end - seconds, end)
    assert track.samples[first : last + 1] == track.between(end - seconds, end)
    present = [
        (position, sample.value)
        for position, sample in enumerate(track.samples)
        if first <= position <= last and sample.value is not None
    ]
    gauge = track.gauge("value", _value)
    assert gauge.count(first, last) == len(present)
    assert gauge.total(first, last) == math.fsum(value for _, value in present)
    assert gauge.last_present(first, last) == (present[-1][0] if present else None)


@settings(derandomize=True, max_examples=300)
@given(steps, st.booleans())
def test_last_change_is_where_the_value_last_differed(
    plan: list[tuple[int | float | None, bool, bool]], as_columns: bool
) -> None:
    track = _track(12, as_columns)
    _feed(track, plan)
    values = [sample.value for sample in track.samples]
    differs = [p for p in range(1, len(values)) if values[p] != values[p - 1]]
    assert track.last_change("value", _value) == (differs[-1] if differs else 0)


@pytest.mark.parametrize("as_columns", [False, True])
def test_a_track_keeps_one_sample_older_than_the_horizon_and_at_most_max_samples(
    as_columns: bool,
) -> None:
    track = _track(3, as_columns)
    for time in range(0, 60, 10):
        track.append(float(time), _Sample(time))
    assert track.times == [30.0, 40.0, 50.0]
    track.expire(45.0)
    assert track.times == [40.0, 50.0]
    assert [sample.value for sample in track.between(35.0, 50.0)] == [40, 50]


@pytest.mark.parametrize("as_columns", [False, True])
def test_a_full_track_turning_over_holds_no_more_memory(as_columns: bool) -> None:
    # Once full, each sample taken in lets one out, so what the track holds
    # stays flat. (A stamp a sample kept as an int object of its own grew it
    # for 256 samples after the fill: CPython caches the ints up to 256.)
    track, sample = _track(200, as_columns), _Sample(1)
    mine = [tracemalloc.Filter(True, history.__file__), tracemalloc.Filter(True, columns.__file__)]
    tracemalloc.start()
    try:
        for time in range(200):
            track.append(float(time), sample)
        full = tracemalloc.take_snapshot().filter_traces(mine)
        for time in range(200, 400):
            track.append(float(time), sample)
        turned = tracemalloc.take_snapshot().filter_traces(mine)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in turned.compare_to(full, "filename"))
    assert grown < 1024


@settings(derandomize=True, max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=30))
def test_a_sample_handed_over_again_as_the_same_object_reads_back_at_every_position(
    plan: list[tuple[int, bool]],
) -> None:
    # A source hands back its last sample where nothing changed (0 here): the
    # track, keeping only its latest sample whole, puts nothing for it and must
    # still read it back at each position, around replaced samples too.
    others = (_Sample(1), _Sample(2), _Sample(1.0))
    track = _track(1000, as_columns=True)
    expected: list[_Sample] = []
    time = 0.0
    for which, replacing in plan:
        sample = others[which] if which or not expected else expected[-1]
        if replacing and expected:
            expected[-1] = sample
        else:
            time += 10
            expected.append(sample)
        track.append(time, sample)
    read = [(s.value, type(s.value)) for s in track.samples]
    assert read == [(s.value, type(s.value)) for s in expected]
