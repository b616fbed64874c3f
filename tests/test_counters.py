"""Counter maths: increases across resets and saturation, windows, gauge areas."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwatchd.counters import (
    Increase,
    gauge_integral,
    increase,
    increase_over,
    is_saturated,
    saturation_max,
    since_cleared,
    until_saturated,
    window,
)


def test_a_steady_counter_increases_by_its_difference() -> None:
    result = increase([(0.0, 10), (10.0, 30), (20.0, 70)])
    assert result == Increase(increase=60.0, seconds=20.0)
    assert result.rate == 3.0


def test_a_counter_that_goes_backwards_is_a_reset_counted_from_zero() -> None:
    # Driver reload between 10 s and 20 s: 500 -> 7 means 7 counted since the reset.
    result = increase([(0.0, 400), (10.0, 500), (20.0, 7), (30.0, 17)])
    assert result.increase == 100 + 7 + 10
    assert result.resets == 1
    assert not result.saturated


def test_a_counter_reaching_its_width_is_saturated_and_keeps_the_increase_up_to_it() -> None:
    result = increase([(0.0, 65000), (10.0, 65535), (20.0, 65535)], bits=16)
    assert result.increase == 535
    assert result.saturated


def test_a_counter_below_its_width_is_not_saturated() -> None:
    assert not increase([(0.0, 0), (10.0, 65534)], bits=16).saturated


def test_absent_values_are_skipped_not_read_as_zero() -> None:
    result = increase([(0.0, 100), (10.0, None), (20.0, 150)])
    assert result.increase == 50 and result.resets == 0
    assert result.seconds == 20.0


def test_no_present_value_gives_no_increase_and_a_zero_rate() -> None:
    result = increase([(0.0, None), (10.0, None)])
    assert result.increase == 0.0 and result.seconds == 0.0 and result.rate == 0.0


def test_saturation_max_and_is_saturated_follow_the_width() -> None:
    assert saturation_max(8) == 255 and saturation_max(None) is None
    assert is_saturated(255, 8) and is_saturated(256, 8)
    assert not is_saturated(254, 8)
    assert not is_saturated(2**64, None)
    assert not is_saturated(None, 8)


def test_a_window_keeps_the_point_just_before_it() -> None:
    points = [(0.0, 1), (10.0, 2), (20.0, 3), (30.0, 4)]
    assert window(points, now=30.0, seconds=15.0) == points[1:]
    assert window(points, now=30.0, seconds=100.0) == points


def test_a_window_after_the_last_point_keeps_the_last_point_only() -> None:
    points = [(0.0, 1), (10.0, 2)]
    assert window(points, now=100.0, seconds=5.0) == points[1:]


def test_increase_over_counts_only_the_window() -> None:
    points = [(0.0, 0), (10.0, 100), (20.0, 110), (30.0, 120)]
    result = increase_over(points, now=30.0, seconds=15.0)
    assert result.increase == 20 and result.seconds == 20.0


def test_gauge_integral_counts_each_interval_at_its_lower_end() -> None:
    # A 400 -> 200 drop between samples is not credited with 400 for the interval.
    assert gauge_integral([(0.0, 400.0), (10.0, 200.0), (20.0, 200.0)]) == 2000.0 + 2000.0


def test_gauge_integral_leaves_out_intervals_with_an_absent_end() -> None:
    assert gauge_integral([(0.0, 5.0), (10.0, None), (20.0, 5.0), (30.0, 5.0)]) == 50.0
    assert gauge_integral([(0.0, 5.0)]) == 0.0
    assert gauge_integral([]) == 0.0


counter_values = st.lists(st.integers(min_value=0, max_value=2**16 - 1), min_size=1, max_size=30)


@given(counter_values)
def test_increase_is_never_negative_and_never_more_than_the_values_seen(values: list[int]) -> None:
    points = [(float(position), value) for position, value in enumerate(values)]
    result = increase(points, bits=16)
    assert 0 <= result.increase <= sum(values)
    assert result.saturated == any(value == 2**16 - 1 for value in values)


@given(counter_values)
def test_a_counter_that_only_grows_increases_by_last_minus_first(values: list[int]) -> None:
    ordered = sorted(values)
    points = [(float(position), value) for position, value in enumerate(ordered)]
    result = increase(points)
    assert result.increase == ordered[-1] - ordered[0]
    assert result.resets == 0


def test_a_window_of_timed_samples_keeps_its_sample_type() -> None:
    samples = [(0.0, "a"), (10.0, "b"), (20.0, "c")]
    assert window(samples, now=20.0, seconds=5.0) == [(10.0, "b"), (20.0, "c")]


def test_until_saturated_stops_at_the_first_point_at_the_maximum() -> None:
    points = [(0.0, 10), (10.0, 200), (20.0, 255), (30.0, 255)]
    assert until_saturated(points, bits=8) == points[:3]
    assert until_saturated(points, bits=16) == points
    assert until_saturated(points, bits=None) == points


def test_a_rate_up_to_saturation_is_not_diluted_by_the_time_after_it() -> None:
    # 245 counted in the first 20 s, then nothing: 12.25/s is the lower bound,
    # where the whole window would have said 8.2/s.
    points = [(0.0, 10), (10.0, 200), (20.0, 255), (30.0, 255)]
    assert increase(until_saturated(points, bits=8), bits=8).rate == 245 / 20


def test_since_cleared_starts_where_the_counter_last_came_down_from_its_maximum() -> None:
    points = [(0.0, 255), (10.0, 255), (20.0, 3), (30.0, None), (40.0, 9)]
    assert since_cleared(points, bits=8) == points[2:]
    # A drop from below the maximum is a reset, not a clear of a stuck counter.
    assert since_cleared([(0.0, 200), (10.0, 3)], bits=8) == [(0.0, 200), (10.0, 3)]
    assert since_cleared(points, bits=None) == points
