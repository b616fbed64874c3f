"""The last sample of every GPU, port and PCIe function, so that rates and
counter baselines are right across a restart: recorded with every poll,
replayed into History before the first poll of the next run.

A GPU's sample is kept under its board's UUID (a GPU without one has none
kept): the next run gives it to the GPU that has that UUID then, at whatever
index (identity.py), and to no other. The newest samples also say which
board was at which index when they were taken, which is how the CLI resolves
`gpu:<index>` with the daemon down (`boards`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import fields
from operator import attrgetter
from typing import Any

from gpuwatchd.model import (
    Board,
    GpuSample,
    LinkSample,
    PcieFunctionSample,
    PortSample,
    Reading,
)
from gpuwatchd.store.database import Database

log = logging.getLogger(__name__)


class LastSamples:
    def __init__(self, database: Database) -> None:
        self._database = database

    def readings(self, now: float, max_age: float) -> tuple[Reading, ...]:
        """The last saved sample of every GPU, port and PCIe function no older than `max_age`,
        as readings to record into History before the first poll."""
        with self._database.reading() as db:
            rows = db.execute(
                "SELECT kind, time, data FROM last_samples WHERE time >= ? ORDER BY time",
                (now - max_age,),
            ).fetchall()
        gpus: dict[float, list[GpuSample]] = defaultdict(list)
        ports: dict[float, list[PortSample]] = defaultdict(list)
        functions: dict[float, list[PcieFunctionSample]] = defaultdict(list)
        for row in rows:
            try:
                data = json.loads(row["data"])
                if row["kind"] == "gpu":
                    gpus[row["time"]].append(_decode_gpu(data))
                elif row["kind"] == "pcie":
                    functions[row["time"]].append(_decode_pcie(data))
                else:
                    ports[row["time"]].append(_decode_port(data))
            except (ValueError, TypeError, KeyError) as error:
                # A baseline that no longer decodes (an older model) only costs one rate.
                log.warning("skipping a saved sample that does not decode: %s", error)
        return tuple(
            Reading(
                source="store",
                time=time,
                gpus=tuple(gpus[time]) if time in gpus else None,
                ports=tuple(ports[time]) if time in ports else None,
                pcie_functions=tuple(functions[time]) if time in functions else None,
            )
            for time in sorted(gpus.keys() | ports.keys() | functions.keys())
        )

    def gpu(self, uuid: str) -> tuple[float, GpuSample] | None:
        """The last sample saved of the board `uuid`, and when it was taken."""
        with self._database.reading() as db:
            row = db.execute(
                "SELECT time, data FROM last_samples WHERE kind = 'gpu' AND subject = ?", (uuid,)
            ).fetchone()
        return None if row is None else (row["time"], _decode_gpu(json.loads(row["data"])))

    def boards(self) -> tuple[Board, ...]:
        """The board last seen at each index, by the newest saved samples."""
        with self._database.reading() as db:
            rows = db.execute(
                "SELECT subject, data FROM last_samples WHERE kind = 'gpu' ORDER BY time"
            ).fetchall()
        at: dict[int, Board] = {}
        for row in rows:
            data = json.loads(row["data"])
            if isinstance(data, dict) and isinstance(data.get("index"), int):
                at[data["index"]] = Board(row["subject"], data["index"], data.get("pci_bus_id"))
        return tuple(at[index] for index in sorted(at))


class SampleTexts:
    """How samples become the JSON kept of them, remembering what each text
    was made of: the NVML source hands over the last poll's tuple of links
    (and mappings) where none changed, and a PCIe function's sample is most
    polls equal to the last one. Keyed by the objects themselves (frozen, and
    held here, so never another's), or by a sample that `_same_json` says is
    written the same. (The PCIe source hands over the last poll's sample
    itself where its files read the same.)"""

    def __init__(self) -> None:
        self._links: dict[str, tuple[tuple[LinkSample, ...], str]] = {}
        self._xid_counts: dict[str, tuple[Mapping[int, int], str]] = {}
        self._functions: dict[str, tuple[PcieFunctionSample, tuple[object, ...], str]] = {}

    def gpu(self, sample: GpuSample, uuid: str) -> str:
        """A GpuSample as JSON: mappings with tuple or int keys become lists;
        the links and the XID counts (the last fields) after the others, the
        links' and counts' text as remembered."""
        data = dict(zip(_GPU_FIELDS_BEFORE_LINKS, _gpu_fields_before_links(sample), strict=True))
        data["throttle_seconds"] = dict(sample.throttle_seconds)
        data["ecc_errors"] = [[kind, scope, n] for (kind, scope), n in sample.ecc_errors.items()]
        data["retired_pages"] = dict(sample.retired_pages)
        head = json.dumps(data)[:-1]
        links = self._links_text(uuid, sample.nvlinks)
        xid_counts = self._xid_counts_text(uuid, sample.xid_counts)
        return f'{head}, "nvlinks": {links}, "xid_counts": {xid_counts}}}'

    def pcie(self, sample: PcieFunctionSample) -> str:
        last = self._functions.get(sample.address)
        if last is not None and last[0] is sample:
            return last[2]
        values = _pcie_fields(sample)
        if last is not None and _same_json(last[1], values):
            text = last[2]
        else:
            text = json.dumps(_encode_pcie(sample))
        self._functions[sample.address] = (sample, values, text)
        return text

    def _links_text(self, uuid: str, links: tuple[LinkSample, ...]) -> str:
        last = self._links.get(uuid)
        if last is not None and last[0] is links:
            return last[1]
        text = json.dumps(
            [
                {
                    "link": link.link,
                    "up": link.up,
                    "errors": dict(link.errors),
                    "ber": dict(link.ber),
                }
                for link in links
            ]
        )
        self._links[uuid] = (links, text)
        return text

    def _xid_counts_text(self, uuid: str, counts: Mapping[int, int]) -> str:
        last = self._xid_counts.get(uuid)
        if last is not None and last[0] is counts:
            return last[1]
        text = json.dumps([[code, n] for code, n in counts.items()])
        self._xid_counts[uuid] = (counts, text)
        return text


def _same_json(a: object, b: object) -> bool:
    """Whether `b` is written in JSON as `a` is: the same object, or an equal
    one of the same type whose items (a mapping's keys in the same order) are
    so too. A float only as the same object: -0.0 equals 0.0 but is written
    otherwise."""
    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, float) or a != b:
        return False
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping)
        return tuple(a) == tuple(b) and all(map(_same_json, a.values(), b.values()))
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        return all(map(_same_json, a, b))
    return True


def record_samples(db: sqlite3.Connection, readings: Iterable[Reading], texts: SampleTexts) -> None:
    readings = tuple(readings)
    # One statement for all rows of a kind.
    db.executemany(
        _SAVE,
        [
            (gpu.uuid, "gpu", reading.time, texts.gpu(gpu, gpu.uuid))
            for reading in readings
            for gpu in reading.gpus or ()
            if gpu.uuid
        ],
    )
    db.executemany(
        _SAVE,
        [
            (port.subject, "port", reading.time, json.dumps(_encode_port(port)))
            for reading in readings
            for port in reading.ports or ()
        ],
    )
    # The AER counters' baseline: an error while the daemon was down
    # still shows as growth after it starts.
    db.executemany(
        _SAVE,
        [
            (f"pcie:{function.address}", "pcie", reading.time, texts.pcie(function))
            for reading in readings
            for function in reading.pcie_functions or ()
        ],
    )


# A subject's row, made or changed in place (cheaper in sqlite than the
# delete and insert of INSERT OR REPLACE, to the same row).
_SAVE = (
    "INSERT INTO last_samples VALUES (?, ?, ?, ?) ON CONFLICT (subject)"
    " DO UPDATE SET kind = excluded.kind, time = excluded.time, data = excluded.data"
)


# Field names in their order, found once: dataclasses.fields() costs as
# much as encoding a small sample.
_GPU_FIELDS = tuple(f.name for f in fields(GpuSample))
_PORT_FIELDS = tuple(f.name for f in fields(PortSample))
_PCIE_FIELDS = tuple(f.name for f in fields(PcieFunctionSample))
_GPU_FIELDS_BEFORE_LINKS = tuple(f for f in _GPU_FIELDS if f not in ("nvlinks", "xid_counts"))
_gpu_fields_before_links = attrgetter(*_GPU_FIELDS_BEFORE_LINKS)
_pcie_fields = attrgetter(*_PCIE_FIELDS)


def _decode_gpu(data: Mapping[str, Any]) -> GpuSample:
    known = {f.name for f in fields(GpuSample)}
    values = {key: value for key, value in data.items() if key in known}
    values["ecc_errors"] = {(kind, scope): n for kind, scope, n in data.get("ecc_errors", ())}
    values["nvlinks"] = tuple(
        LinkSample(
            gpu=data["index"],
            link=link["link"],
            up=link["up"],
            errors=link["errors"],
            ber=link.get("ber", {}),
        )
        for link in data.get("nvlinks", ())
    )
    values["xid_counts"] = {int(code): n for code, n in data.get("xid_counts", ())}
    return GpuSample(**values)


def _encode_port(sample: PortSample) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(sample, name) for name in _PORT_FIELDS}
    data["counters"] = dict(sample.counters)
    data["hw_counters"] = dict(sample.hw_counters)
    return data


def _encode_pcie(sample: PcieFunctionSample) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(sample, name) for name in _PCIE_FIELDS}
    data["aer_errors"] = dict(sample.aer_errors)
    data["aer_causes"] = dict(sample.aer_causes)
    return data


def _decode_pcie(data: Mapping[str, Any]) -> PcieFunctionSample:
    known = {f.name for f in fields(PcieFunctionSample)}
    return PcieFunctionSample(**{key: value for key, value in data.items() if key in known})


def _decode_port(data: Mapping[str, Any]) -> PortSample:
    known = {f.name for f in fields(PortSample)}
    return PortSample(**{key: value for key, value in data.items() if key in known})
