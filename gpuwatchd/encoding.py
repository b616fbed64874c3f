"""The Snapshot's metric families in the Prometheus text format (0.0.4) and in
OpenMetrics 1.0, byte for byte as prometheus_client encodes them, at a
fraction of the cost.

prometheus_client escapes and validates every metric name, label name and
label value again for every sample; on a node's page most of them repeat
(the same dozen label names, a GPU's index and UUID on each of its series),
so this encoder calls the very same escaping functions once per distinct
string and keeps the answers from one render to the next (they depend on the
string alone). A HeldFamily keeps its own lines, so that a family that did
not change between polls is not encoded again, and one held by its series
writes each line from a prefix (name and labels) kept for its family's name
(LinePrefixes), so that one moved value does not escape and sort the
labels of every series again. Everything else is the
library's line format. A family outside what it handles (a type other than gauge,
counter and info, or a sample with a timestamp, an exemplar, a native
histogram or an OpenMetrics-only `_created` series) is encoded by
prometheus_client itself. tests/test_encoding.py holds the two equal on real
pages and on hostile names and values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

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
Text = TypeVar("Text", str, float)  # what a memo writes: a name or label value, or a sample value


class _Memo(dict[Text, str]):
    """`escape(s)` for each distinct `s`, computed once and kept across
    renders (the answer depends on `s` alone); emptied when it holds `bound`
    strings, so that label values that come and go cannot grow it for ever."""

    def __init__(self, escape: Callable[[Text], str], bound: int = MEMO_BOUND) -> None:
        super().__init__()
        self._escape: Callable[[Text], str] = escape
        self._bound = bound

    def __missing__(self, key: Text) -> str:
        if len(self) >= self._bound:
            self.clear()
        value = self[key] = self._escape(key)
        return value


class _Floats(_Memo[float]):
    """A sample value as Go writes it, for each distinct value, kept across
    renders as `_Memo` keeps strings. 0.0 and -0.0 are one key but two texts:
    zero is written by its sign, and never kept."""

    def __init__(self, bound: int = MEMO_BOUND) -> None:
        super().__init__(_go_float, bound)

    def __missing__(self, value: float) -> str:
        if value == 0:
            return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
        return super().__missing__(value)


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


def _handled_type(family: Metric) -> bool:
    return family.type in HANDLED_TYPES and not family.unit


def _handled(family: Metric) -> bool:
    if not _handled_type(family):
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
_FLOATS = _Floats()


PrefixKey = tuple[bool, tuple[str, ...]]  # OpenMetrics or not, a series' label values
Shape = tuple[str, tuple[str, ...]]  # a family's sample name and label names


class LinePrefixes(dict[PrefixKey, str]):
    """Each series' line up to its value (`name{labels} `), by format and
    label values, for the held families of one name whose samples are shaped
    as `shape` (gpuwatchd.export.held), kept from one render to the next: a
    family rebuilt because one value moved writes the others' lines without
    escaping and sorting their labels again. Emptied at `bound` as `_Memo` is."""

    def __init__(self, shape: Shape | None, bound: int = MEMO_BOUND) -> None:
        super().__init__()
        self.shape = shape
        self._bound = bound

    @staticmethod
    def shape_of(family: Metric) -> Shape | None:
        if not family.samples:
            return None
        sample = family.samples[0]
        return sample.name, tuple(sample.labels)

    def keep(self, key: PrefixKey, prefix: str) -> str:
        if len(self) >= self._bound:
            self.clear()
        self[key] = prefix
        return prefix


class HeldFamily(Metric):
    """A family kept from one render to the next while what it is made of
    stays the same (gpuwatchd.export.held): its encodings are kept with it,
    so its samples must not change once it is made.

    `label_values`, where given, are each sample's label values in the order
    of its labels, and its samples are plain ones (a label set and a float,
    as `add_metric` makes them, all shaped as `prefixes.shape`): its lines
    are written with `prefixes`, kept for the families of its name."""

    def __init__(
        self,
        family: Metric,
        label_values: Sequence[tuple[str, ...]] = (),
        prefixes: LinePrefixes | None = None,
    ) -> None:
        super().__init__(family.name, family.documentation, family.type, family.unit)
        self.samples = family.samples
        self.label_values = label_values
        self.prefixes = prefixes
        # OpenMetrics or not -> the family's header, then a line a sample.
        self.encoded: dict[bool, list[str]] = {}


class _Encoder:
    def __init__(self, openmetrics_format: bool) -> None:
        self.openmetrics = openmetrics_format
        self.metric_names = _METRIC_NAMES
        self.sample_names = _OPENMETRICS_SAMPLE_NAMES if openmetrics_format else _METRIC_NAMES
        self.label_names = _LABEL_NAMES
        self.label_values = _LABEL_VALUES
        self.floats = _FLOATS

    def family(self, family: Metric) -> str:
        if not isinstance(family, HeldFamily):
            return "".join(self._lines(family))
        lines = family.encoded.get(self.openmetrics)
        if lines is None:
            lines = family.encoded[self.openmetrics] = self._held_lines(family)
        return "".join(lines)

    def _held_lines(self, family: HeldFamily) -> list[str]:
        if family.prefixes is None or not family.samples or not _handled_type(family):
            return self._lines(family)
        prefixes = family.prefixes
        lines = [self._header(family)]
        for labels, sample in zip(family.label_values, family.samples, strict=True):
            key = (self.openmetrics, labels)
            prefix = prefixes.get(key) or prefixes.keep(key, self._prefix(sample))
            lines.append(f"{prefix}{self.floats[sample.value]}\n")
        return lines

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
        return f"{self._prefix(sample)}{self.floats[sample.value]}\n"

    def _prefix(self, sample: Sample) -> str:
        """The sample's line up to its value: its name and labels, and a space."""
        if not sample.labels:
            return f"{self.sample_names[sample.name]} "
        label_names, label_values = self.label_names, self.label_values
        labels = ",".join(
            [
                f'{label_names[key]}="{label_values[text]}"'
                for key, text in sorted(sample.labels.items())
            ]
        )
        return f"{self.sample_names[sample.name]}{{{labels}}} "

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
