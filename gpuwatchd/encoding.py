"""The Snapshot's metric families in the Prometheus text format (0.0.4) and in
OpenMetrics 1.0, byte for byte as prometheus_client encodes them, at a
fraction of the cost.

prometheus_client escapes and validates every metric name, label name and
label value again for every sample; on a node's page most of them repeat
(the same dozen label names, a GPU's index and UUID on each of its series),
so this encoder calls the very same escaping functions once per distinct
string in a render and keeps the answers. Everything else is the library's
line format. A family outside what it handles (a type other than gauge,
counter and info, or a sample with a timestamp, an exemplar, a native
histogram or an OpenMetrics-only `_created` series) is encoded by
prometheus_client itself. tests/test_encoding.py holds the two equal on real
pages and on hostile names and values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import exposition
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
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


class _Memo(dict[str, str]):
    """`escape(s)` for each distinct `s`, computed once."""

    def __init__(self, escape: Callable[[str], str]) -> None:
        super().__init__()
        self._escape = escape

    def __missing__(self, key: str) -> str:
        value = self[key] = self._escape(key)
        return value


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


class _Encoder:
    def __init__(self, openmetrics_format: bool) -> None:
        self.openmetrics = openmetrics_format
        self.metric_names = _Memo(_metric_name)
        self.sample_names = _Memo(_openmetrics_sample_name if openmetrics_format else _metric_name)
        self.label_names = _Memo(_label_name)
        self.label_values = _Memo(_label_value)

    def family(self, family: Metric) -> str:
        if not _handled(family):
            return self._by_the_library(family)
        if self.openmetrics:
            name = self.metric_names[family.name]
            lines = [
                f"# HELP {name} {_openmetrics_help(family.documentation)}\n"
                f"# TYPE {name} {family.type}\n"
            ]
        else:
            name = self.metric_names[family.name + TEXT_SUFFIX[family.type]]
            lines = [
                f"# HELP {name} {_text_help(family.documentation)}\n"
                f"# TYPE {name} {TEXT_TYPE[family.type]}\n"
            ]
        sample_names, label_names, label_values = (
            self.sample_names,
            self.label_names,
            self.label_values,
        )
        for sample in family.samples:
            if sample.labels:
                labels = ",".join(
                    [
                        f'{label_names[key]}="{label_values[value]}"'
                        for key, value in sorted(sample.labels.items())
                    ]
                )
                lines.append(f"{sample_names[sample.name]}{{{labels}}} {_go_float(sample.value)}\n")
            else:
                lines.append(f"{sample_names[sample.name]} {_go_float(sample.value)}\n")
        return "".join(lines)

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
