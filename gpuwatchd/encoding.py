"""The Snapshot's metric families in the Prometheus text format (0.0.4) and in
OpenMetrics 1.0, byte for byte as prometheus_client encodes them, at a
fraction of the cost.

prometheus_client escapes and validates every metric name, label name and
label value again for every sample; on a node's page most of them repeat
(the same dozen label names, a GPU's index and UUID on each of its series),
so this encoder calls the very same escaping functions once per distinct
string and keeps the answers from one render to the next (they depend on the
string alone). A HeldFamily keeps its own lines, so that a family that did
not change between polls is not encoded again. Everything else is the
library's line format. A family outside what it handles (a type other than gauge,
counter and info, or a sample with a timestamp, an exemplar, a native
histogram or an OpenMetrics-only `_created` series) is encoded by
prometheus_client itself. tests/test_encoding.py holds the two equal on real
pages and on hostile names and values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

from prometheus_client import exposition
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

HANDLED_TYPES = frozenset({"gauge", "counter", "info"})
# The Prometheus text format's names and types for the handled OpenMetrics ones.
TEXT_SUFFIX = {"gauge": "", "counter": "_total", "info": "_info"}
TEXT_TYPE = {"gauge": "gauge", "counter": "counter", "info": "gauge"}
# Samples the text format moves into gauges of their own at the family's end.
TEXT_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")
UNDERSCORES = openmetrics.UNDERSCORES
# prometheus_client's own, typed here (the library leaves them unannotated).
_go_float: Callable[[float], str] = floatToGoString
_openmetrics_encoder: Callable[[Collector, str, str], bytes] = openmetrics.generate_latest
# Distinct names and label values kept escaped at most: a node's page has about
# 500 (its subjects, UUIDs and label names).
MEMO_BOUND = 10_000


class _Memo(dict[str, str]):
    """`escape(s)` for each distinct `s`, computed once and kept across
    renders (the answer depends on `s` alone); emptied when it holds `bound`
    strings, so that label values that come and go cannot grow it for ever."""

    def __init__(self, escape: Callable[[str], str], bound: int = MEMO_BOUND) -> None:
        super().__init__()
        self._escape = escape
        self._bound = bound

    def __missing__(self, key: str) -> str:
        if len(self) >= self._bound:
            self.clear()
        value = self[key] = self._escape(key)
        return value


class _Floats(dict[float, str]):
    """A sample value as Go writes it, for each distinct value in one page.
    0.0 and -0.0 are one key but two texts: zero is written by its sign."""

    def __missing__(self, value: float) -> str:
        if value == 0:
            return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
        text = self[value] = _go_float(value)
        return text


def _label_value(value: str) -> str:
    return openmetrics._escape(value, openmetrics.ALLOWUTF8, openmetrics._is_legacy_labelname_rune)


def _openmetrics_sample_name(name: str) -> str:
    return openmetrics._escape(name, UNDERSCORES, openmetrics._is_legacy_labelname_rune)


def _metric_name(name: str) -> str:
    return openmetrics.escape_metric_name(name, UNDERSCORES)


def _label_name(name: str) -> str:
    return openmetrics.escape_label_name(name, UNDERSCORES)


def _text_help(documentation: str) -> str:
    return documentation.replace("\\", r"\\").replace("\n", r"\n")


def _openmetrics_help(documentation: str) -> str:
    return openmetrics._escape(
        documentation, openmetrics.ALLOWUTF8, openmetrics._is_legacy_labelname_rune
    )


class _One(Collector):
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        yield self._family


def _handled(family: Metric) -> bool:
    if family.type not in HANDLED_TYPES or family.unit:
        return False
    moved = tuple(family.name + suffix for suffix in TEXT_MOVED_SUFFIXES)
    return all(
        sample.timestamp is None
        and sample.exemplar is None
        and sample.native_histogram is None
        and sample.value is not None
        and sample.name not in moved
        for sample in family.samples
    )


_METRIC_NAMES = _Memo(_metric_name)
_OPENMETRICS_SAMPLE_NAMES = _Memo(_openmetrics_sample_name)
_LABEL_NAMES = _Memo(_label_name)
_LABEL_VALUES = _Memo(_label_value)
_OPENMETRICS_HELPS = _Memo(_openmetrics_help)
_TEXT_HELPS = _Memo(_text_help)


class HeldFamily(Metric):
    """A family kept from one render to the next while what it is made of
    stays the same (gpuwatchd.export.held): its encodings are kept with it,
    so its samples must not change once it is made.

    `series_keys`, where given, are what each sample is made of, one a sample
    (its label values and value): a family made to replace `previous` re-uses
    the lines of the samples whose key it had too."""

    def __init__(
        self,
        family: Metric,
        series_keys: Sequence[Hashable] = (),
        previous: HeldFamily | None = None,
    ) -> None:
        super().__init__(family.name, family.documentation, family.type, family.unit)
        self.samples = family.samples
        self.series_keys = series_keys
        # OpenMetrics or not -> the family's header, then a line a sample.
        self.encoded: dict[bool, list[str]] = {}
        self._previous: HeldFamily | None = previous
        if previous is not None:
            previous._previous = None  # one family back is enough to re-use lines

    def reusable(self, openmetrics_format: bool) -> dict[Hashable, str]:
        """The lines of the family this one replaced, by their sample's key."""
        previous = self._previous
        if previous is None or not _same_shape(self, previous):
            return {}
        lines = previous.encoded.get(openmetrics_format)
        if lines is None or len(lines) != len(previous.series_keys) + 1:
            return {}
        return dict(zip(previous.series_keys, lines[1:], strict=True))


def _same_shape(family: HeldFamily, other: HeldFamily) -> bool:
    """Whether `other`'s lines are written as `family`'s are, given equal keys."""
    if len(family.series_keys) != len(family.samples):
        return False
    if not family.samples or not other.samples:
        return True
    mine, theirs = family.samples[0], other.samples[0]
    return (mine.name, tuple(mine.labels)) == (theirs.name, tuple(theirs.labels))


class _Encoder:
    def __init__(self, openmetrics_format: bool) -> None:
        self.openmetrics = openmetrics_format
        self.metric_names = _METRIC_NAMES
        self.sample_names = _OPENMETRICS_SAMPLE_NAMES if openmetrics_format else _METRIC_NAMES
        self.label_names = _LABEL_NAMES
        self.label_values = _LABEL_VALUES
        self.floats = _Floats()

    def family(self, family: Metric) -> str:
        if not isinstance(family, HeldFamily):
            return "".join(self._lines(family))
        lines = family.encoded.get(self.openmetrics)
        if lines is None:
            lines = family.encoded[self.openmetrics] = self._held_lines(family)
        return "".join(lines)

    def _held_lines(self, family: HeldFamily) -> list[str]:
        reusable = family.reusable(self.openmetrics)
        if not reusable or not _handled(family):
            return self._lines(family)
        line = self._line
        return [
            self._header(family),
            *(
                reusable.get(key) or line(sample)
                for key, sample in zip(family.series_keys, family.samples, strict=True)
            ),
        ]

    def _lines(self, family: Metric) -> list[str]:
        """The family's header, then a line a sample (or the library's text, whole)."""
        if not _handled(family):
            return [self._by_the_library(family)]
        line = self._line
        return [self._header(family), *(line(sample) for sample in family.samples)]

    def _header(self, family: Metric) -> str:
        if self.openmetrics:
            name = self.metric_names[family.name]
            return (
                f"# HELP {name} {_OPENMETRICS_HELPS[family.documentation]}\n"
                f"# TYPE {name} {family.type}\n"
            )
        name = self.metric_names[family.name + TEXT_SUFFIX[family.type]]
        return (
            f"# HELP {name} {_TEXT_HELPS[family.documentation]}\n"
            f"# TYPE {name} {TEXT_TYPE[family.type]}\n"
        )

    def _line(self, sample: Sample) -> str:
        value = self.floats[sample.value]
        if not sample.labels:
            return f"{self.sample_names[sample.name]} {value}\n"
        label_names, label_values = self.label_names, self.label_values
        labels = ",".join(
            [
                f'{label_names[key]}="{label_values[text]}"'
                for key, text in sorted(sample.labels.items())
            ]
        )
        return f"{self.sample_names[sample.name]}{{{labels}}} {value}\n"

    def _by_the_library(self, family: Metric) -> str:
        if self.openmetrics:
            encoded = _openmetrics_encoder(_One(family), UNDERSCORES, "1.0.0")
            return encoded.decode("utf-8").removesuffix("# EOF\n")
        return exposition.generate_latest(_One(family), UNDERSCORES).decode("utf-8")


def encode(families: Iterable[Metric], openmetrics_format: bool) -> bytes:
    """`families` as prometheus_client's text (0.0.4) or OpenMetrics 1.0
    encoder writes them with underscore escaping; OpenMetrics without its
    closing `# EOF` line."""
    encoder = _Encoder(openmetrics_format)
    return "".join([encoder.family(family) for family in families]).encode("utf-8")
