"""Typed, frozen settings loaded from YAML, with errors that name file, line and key.

Each layer declares its own settings as frozen dataclasses beside the code
that uses them (a check's thresholds live in the check's module, with their
source in a comment). `load(cls, text, filename)` builds such a dataclass
from YAML: unknown keys, wrong types and bad values are errors that say where
they are, never silently ignored. Durations are declared as `Seconds` and
accept `500ms`, `10s`, `5m`; rates as `PerSecond` and accept `N/s`, `N/min`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from gpuwatchd.units import MAX_DURATION_SECONDS, parse_duration, parse_rate

T = TypeVar("T")


class _Parser:
    def __init__(self, parse: Callable[[object], float]) -> None:
        self.parse = parse


class Check:
    """`Annotated[T, Check(fn)]`: `fn(value)` raises ValueError for a bad value,
    reported at that key's line."""

    def __init__(self, check: Callable[[Any], object]) -> None:
        self.check = check


def _duration_with_unit(value: object) -> float:
    """A config's duration: a bare number other than 0 is refused, since
    `poll_interval: 10` could mean seconds or minutes to whoever reads it."""
    # NaN, infinity and 400-digit numbers are refused as such by parse_duration.
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value != 0
        and abs(value) <= MAX_DURATION_SECONDS
    ):
        raise ValueError(f"{value!r} has no unit: write {value!r}s (or 500ms, 5m, 2h)")
    return parse_duration(value)


Seconds = Annotated[float, _Parser(_duration_with_unit)]
PerSecond = Annotated[float, _Parser(parse_rate)]


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names file, line and key."""

    def __init__(self, filename: str, line: int | None, key: str, problem: str) -> None:
        where = f"{filename}:{line}" if line is not None else filename
        super().__init__(f"{where}: {key or '(top level)'}: {problem}")
        self.filename = filename
        self.line = line
        self.key = key
        self.problem = problem


class _Loader:
    def __init__(self, filename: str) -> None:
        self.filename = filename

    def fail(self, node: yaml.Node | None, key: str, problem: str) -> typing.NoReturn:
        line = node.start_mark.line + 1 if node is not None else None
        raise SettingsError(self.filename, line, key, problem)

    def build(self, tp: Any, node: yaml.Node, key: str) -> Any:
        origin = get_origin(tp)
        if origin is Annotated:
            base, *extras = get_args(tp)
            parser = next((extra for extra in extras if isinstance(extra, _Parser)), None)
            try:
                value = parser.parse(self.scalar(node, key)) if parser else None
                if parser is None:
                    value = self.build(base, node, key)
                for extra in extras:
                    if isinstance(extra, Check):
                        extra.check(value)
            except SettingsError:
                raise
            except ValueError as error:
                self.fail(node, key, str(error))
            return value
        if origin in (types.UnionType, typing.Union):
            options = [arg for arg in get_args(tp) if arg is not type(None)]
            if self.is_null(node):
                if len(options) < len(get_args(tp)):
                    return None
                self.fail(node, key, "a value is required here")
            return self.build(options[0], node, key)
        if origin is Literal:
            value = self.scalar(node, key)
            if value not in get_args(tp):
                allowed = ", ".join(repr(arg) for arg in get_args(tp))
                self.fail(node, key, f"must be one of {allowed}, got {value!r}")
            return value
        if origin is tuple:
            item_type = get_args(tp)[0]
            if not isinstance(node, yaml.SequenceNode):
                self.fail(node, key, "expected a list")
            return tuple(
                self.build(item_type, item, f"{key}[{position}]")
                for position, item in enumerate(node.value)
            )
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(tp, node, key)
        return self.plain(tp, node, key)

    @staticmethod
    def is_null(node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"

    def scalar(self, node: yaml.Node, key: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, key, "expected a single value, not a list or mapping")
        try:
            return yaml.safe_load(yaml.serialize(node))
        except yaml.YAMLError as error:
            self.fail(node, key, f"cannot read this value: {getattr(error, 'problem', error)}")

    def plain(self, tp: Any, node: yaml.Node, key: str) -> Any:
        value = self.scalar(node, key)
        if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
            return self.finite(value, node, key)
        if tp is bool and not isinstance(value, bool):
            self.fail(node, key, f"expected true or false, got {value!r}")
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            self.fail(node, key, f"expected a whole number, got {value!r}")
        if tp is float and not isinstance(value, float):
            self.fail(node, key, f"expected a number, got {value!r}")
        if tp is str and not isinstance(value, str):
            self.fail(node, key, f"expected text, got {value!r}")
        return value

    def finite(self, value: float, node: yaml.Node, key: str) -> float:
        """A number setting as a float: NaN, infinity and a whole number too
        large for a double (`1` and 400 zeros) are no threshold."""
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            self.fail(node, key, f"expected a finite number, got {shown(value)}")
        return number

    def dataclass(self, cls: type[T], node: yaml.Node, key: str) -> T:
        if self.is_null(node):
            return cls()
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, key, "expected a mapping of keys to values")
        hints = get_type_hints(cls, include_extras=True)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        for key_node, value_node in node.value:
            name = key_node.value
            child = f"{key}.{name}" if key else str(name)
            if name not in fields:
                known = ", ".join(sorted(fields))
                self.fail(key_node, child, f"unknown key (known keys: {known})")
            if name in values:
                self.fail(key_node, child, "key given twice")
            values[name] = self.build(hints[name], value_node, child)
        missing = [
            name
            for name, f in fields.items()
            if name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            self.fail(node, key, f"{', '.join(missing)} is required here")
        try:
            result = cls(**values)
        except (TypeError, ValueError) as error:
            self.fail(*self.blamed(node, key, str(error)), str(error))
        return result

    @staticmethod
    def blamed(node: yaml.MappingNode, key: str, problem: str) -> tuple[yaml.Node, str]:
        """The key a mapping's own check blames: the (dotted) field its message
        starts with (`log_level must be ...`) as far as the file spells it out,
        else the mapping itself."""
        named = problem.split(" ", 1)[0]
        blamed: tuple[yaml.Node, str] = (node, key)
        mapping: yaml.Node = node
        path = key
        for part in named.split("."):
            if not isinstance(mapping, yaml.MappingNode):
                break
            found = next(((k, v) for k, v in mapping.value if k.value == part), None)
            if found is None:
                break
            path = f"{path}.{part}" if path else part
            blamed = (found[0], path)
            mapping = found[1]
        return blamed


# Limits on a YAML document (config or scenario), checked before it is built:
# what a person writes is far below them, a YAML bomb far above.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000  # values, with every alias counted as what it stands for


def check_yaml_limits(text: str, filename: str) -> None:
    """Raise SettingsError when `text` is larger, deeper or (through aliases)
    expands to more values than any real settings file. Walks the parser's
    events, which needs no recursion and expands nothing."""
    if len(text) > MAX_YAML_BYTES:
        raise SettingsError(filename, None, "", f"larger than {MAX_YAML_BYTES} bytes")
    sizes: dict[str, int] = {}  # anchor -> how many values it stands for
    open_nodes: list[tuple[int, str | None]] = []  # (values so far, anchor)
    expanded = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = event.start_mark.line + 1 if event.start_mark is not None else None
            if isinstance(event, yaml.CollectionStartEvent):
                open_nodes.append((expanded, event.anchor))
                expanded += 1
                if len(open_nodes) > MAX_YAML_DEPTH:
                    raise SettingsError(
                        filename,
                        line,
                        "",
                        f"nested deeper than {MAX_YAML_DEPTH} levels",
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                before, anchor = open_nodes.pop()
                if anchor is not None:
                    sizes[anchor] = expanded - before
            elif isinstance(event, yaml.ScalarEvent):
                expanded += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                expanded += sizes.get(event.anchor or "", 1)
            if expanded > MAX_YAML_NODES:
                raise SettingsError(
                    filename,
                    line,
                    "",
                    f"expands to more than {MAX_YAML_NODES} values (aliases counted in full)",
                )
    except yaml.YAMLError as error:
        raise _invalid(filename, error) from error


def shown(value: object) -> str:
    """A value for a message: its kind for a list or mapping, else the start
    of its repr, never the whole of a long one (a file's value is anyone's)."""
    if isinstance(value, list | dict):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def _invalid(filename: str, error: yaml.YAMLError) -> SettingsError:
    return SettingsError(filename, *_yaml_problem(error))


def load(cls: type[T], text: str, filename: str = "<config>") -> T:
    """Build `cls` from YAML text; an empty document gives the defaults."""
    check_yaml_limits(text, filename)
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as error:
        raise _invalid(filename, error) from error
    loader = _Loader(filename)
    if node is None:
        return loader.dataclass(cls, yaml.ScalarNode("tag:yaml.org,2002:null", ""), "")
    return loader.dataclass(cls, node, "")


def _yaml_problem(error: yaml.YAMLError) -> tuple[int | None, str, str]:
    """Line, key and message of a YAML error, told by line numbers rather
    than PyYAML's `in "<unicode string>"` marks; where the parser was (an
    unclosed bracket's line) is said too, since the problem is often found
    only at the end of the file."""
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    if context and context_mark is not None:
        problem = f"{problem} ({context} at line {context_mark.line + 1})"
    return line, "", f"not valid YAML: {problem}"


def read_text(path: str, max_bytes: int = MAX_YAML_BYTES, regular_file: bool = False) -> str:
    """A settings file's text (or a capture's: `max_bytes` is then its own
    limit); SettingsError when it cannot be read, is larger than `max_bytes`
    or is not UTF-8. `regular_file`: anything else (a device such as
    /dev/zero, a FIFO) is refused before a byte is read."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular_file else 0)
    try:
        with open(os.open(path, flags), "rb") as handle:
            info = os.fstat(handle.fileno())
            if regular_file and not stat.S_ISREG(info.st_mode):
                raise SettingsError(path, None, "", "not a regular file")
            if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
                raise SettingsError(path, None, "", f"larger than {max_bytes} bytes")
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise SettingsError(path, None, "", f"cannot read: {error.strerror}") from error
    if len(data) > max_bytes:  # a device, or a file that grew
        raise SettingsError(path, None, "", f"larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SettingsError(path, line, "", f"not UTF-8 text: {error.reason}") from error


def load_file(cls: type[T], path: str) -> T:
    return load(cls, read_text(path), path)
