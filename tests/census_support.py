"""Every `Finding` gpuwatchd's source can make, read from the source itself,
and the codes each can name: the census that docs/decisions.md and the fault
code catalog (gpuwatchd/faults.py) are held to.

A finding's code is read where it is written: a literal, a module constant,
either branch of a conditional, an f-string over a module dict's keys, a
function's parameter (then every call of that function in its module says
which), a loop over a tuple of literals, or the `code` attribute of an object
built by a class of the module (then every construction of that class in the
package says which). The XID check names its findings after the catalog's
kinds (`xid_<kind>`), which only the catalog says. Anything else is refused
with its file and line, so that no code escapes the census."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gpuwatchd.checks.xid_catalog import CATALOG, UNKNOWN

REPO = Path(__file__).parent.parent
SOURCES = REPO / "gpuwatchd"
# The one site whose codes only the XID catalog knows: (module, function).
XID_FINDING = ("checks/xid.py", "_finding")
# A Finding's positional parameters, as model.Finding declares them.
FINDING_FIELDS = ("subject", "check", "code")


class Unreadable(Exception):
    """An expression this census cannot reduce to the texts it can be."""


@dataclass(frozen=True)
class Module:
    path: str  # relative to gpuwatchd/, with / separators
    tree: ast.Module
    parents: dict[ast.AST, ast.AST]

    def where(self, node: ast.AST) -> str:
        return f"gpuwatchd/{self.path}:{getattr(node, 'lineno', '?')}"

    def function_of(self, node: ast.AST) -> ast.FunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None

    def bound(self, name: str) -> ast.expr | None:
        """The value of a module-level `name = ...` (annotated or not)."""
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return node.value
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
                return node.value
        return None


@dataclass(frozen=True)
class Site:
    """One `Finding(...)` in the source."""

    module: Module
    call: ast.Call

    def argument(self, name: str) -> ast.expr:
        for keyword in self.call.keywords:
            if keyword.arg == name:
                return keyword.value
        return self.call.args[FINDING_FIELDS.index(name)]

    @property
    def function(self) -> str | None:
        function = self.module.function_of(self.call)
        return function.name if function is not None else None

    def texts(self, name: str) -> set[str]:
        """What the site's `check` or `code` can be."""
        if name == "code" and (self.module.path, self.function) == XID_FINDING:
            return {f"xid_{info.kind.value}" for info in (*CATALOG.values(), UNKNOWN)}
        return texts(self.module, self.argument(name))


@cache
def modules() -> tuple[Module, ...]:
    found = []
    for path in sorted(SOURCES.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        found.append(Module(path.relative_to(SOURCES).as_posix(), tree, parents))
    return tuple(found)


def sites() -> Iterator[Site]:
    for module in modules():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                yield Site(module, node)


def codes() -> dict[str, set[str]]:
    """Every finding code the source can make, with the checks that make it."""
    found: dict[str, set[str]] = {}
    for site in sites():
        checks = site.texts("check")
        for code in site.texts("code"):
            found.setdefault(code, set()).update(checks)
    return found


def texts(module: Module, node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return texts(module, node.body) | texts(module, node.orelse)
    if isinstance(node, ast.JoinedStr):
        parts = [_part(module, value) for value in node.values]
        return {"".join(chosen) for chosen in itertools.product(*parts)}
    if isinstance(node, ast.Name):
        return {t for value in _values(module, node) for t in texts(module, value)}
    if isinstance(node, ast.Attribute):
        return _constructed(module, node.attr)
    raise Unreadable(f"{module.where(node)}: {ast.unparse(node)}")


def _part(module: Module, node: ast.expr) -> set[str]:
    if isinstance(node, ast.FormattedValue):
        return texts(module, node.value)
    return texts(module, node)


def _values(module: Module, name: ast.Name) -> list[ast.expr]:
    """The expressions a name can stand for where it is read: a parameter's
    arguments at every call, a loop variable's items, a module constant."""
    function = module.function_of(name)
    if function is not None:
        parameters = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if name.id in parameters:
            return _arguments(module, function, parameters.index(name.id), name.id)
        loop = _loop_over(function, name.id)
        if loop is not None:
            return _items(module, function, *loop)
    value = module.bound(name.id)
    if value is None:
        raise Unreadable(f"{module.where(name)}: {name.id}")
    return [value]


def _arguments(
    module: Module, function: ast.FunctionDef, position: int, name: str
) -> list[ast.expr]:
    """What every call of `function` in its module passes for one parameter.
    A method's calls (`self.f(...)`, `out.f(...)`) do not pass `self`."""
    method = isinstance(module.parents.get(function), ast.ClassDef)
    found = []
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call) or _called(node) != function.name:
            continue
        found.append(_argument(module, node, position - int(method), name))
    if not found:
        raise Unreadable(f"{module.where(function)}: {function.name} is never called")
    return found


def _called(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _argument(module: Module, call: ast.Call, position: int, name: str) -> ast.expr:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if position < len(call.args) and not isinstance(call.args[position], ast.Starred):
        return call.args[position]
    raise Unreadable(f"{module.where(call)}: {name} is not passed as written")


def _loop_over(function: ast.FunctionDef, name: str) -> tuple[ast.expr, int | None] | None:
    """The iterable of the `for` in `function` that binds `name`, and the
    position of `name` in its target (None: the target is the name)."""
    for node in ast.walk(function):
        if not isinstance(node, ast.For):
            continue
        if isinstance(node.target, ast.Name) and node.target.id == name:
            return node.iter, None
        if isinstance(node.target, ast.Tuple):
            names = [getattr(element, "id", None) for element in node.target.elts]
            if name in names:
                return node.iter, names.index(name)
    return None


def _items(
    module: Module, function: ast.FunctionDef, iterable: ast.expr, position: int | None
) -> list[ast.expr]:
    """The items a loop takes, or their element at `position`: of a tuple or
    list literal (or a local name bound to one), or of a module dict
    (`for key, value in TABLE.items()`, `for key in TABLE`)."""
    if isinstance(iterable, ast.Call) and getattr(iterable.func, "attr", None) == "items":
        pairs = _table(module, iterable.func)
        if position is None:
            raise Unreadable(f"{module.where(iterable)}: a loop over pairs taken whole")
        return [pair[position] for pair in pairs]
    if isinstance(iterable, ast.Name) and isinstance(module.bound(iterable.id), ast.Dict):
        return [key for key, _ in _table(module, iterable)]
    literal = _local_literal(module, function, iterable)
    if position is None:
        return list(literal.elts)
    return [_element(module, item, position) for item in literal.elts]


def _table(module: Module, node: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """The (key, value) pairs of a module dict literal, named by `node`
    (`TABLE`, or the `TABLE.items` of a call)."""
    name = node.value if isinstance(node, ast.Attribute) else node
    value = module.bound(name.id) if isinstance(name, ast.Name) else None
    if not isinstance(value, ast.Dict) or any(key is None for key in value.keys):
        raise Unreadable(f"{module.where(node)}: {ast.unparse(node)} is not a dict literal")
    return [(k, v) for k, v in zip(value.keys, value.values, strict=True) if k is not None]


def _local_literal(
    module: Module, function: ast.FunctionDef, iterable: ast.expr
) -> ast.Tuple | ast.List:
    if isinstance(iterable, ast.Tuple | ast.List):
        return iterable
    if isinstance(iterable, ast.Name):
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == iterable.id for t in node.targets)
                and isinstance(node.value, ast.Tuple | ast.List)
            ):
                return node.value
    raise Unreadable(f"{module.where(iterable)}: the loop over {ast.unparse(iterable)}")


def _element(module: Module, item: ast.expr, position: int) -> ast.expr:
    if not isinstance(item, ast.Tuple | ast.List) or position >= len(item.elts):
        raise Unreadable(f"{module.where(item)}: {ast.unparse(item)} has no element {position}")
    return item.elts[position]


def _constructed(module: Module, attribute: str) -> set[str]:
    """`x.code`: what every construction, anywhere in the package, of the
    classes of `module` that take a `code` passes for it."""
    classes = [c for c in module.tree.body if isinstance(c, ast.ClassDef)]
    taking = {c.name: _fields(c).index(attribute) for c in classes if attribute in _fields(c)}
    if not taking:
        raise Unreadable(f"gpuwatchd/{module.path}: no class takes {attribute!r}")
    found: set[str] = set()
    for other in modules():
        for node in ast.walk(other.tree):
            position = taking.get(_called(node) or "") if isinstance(node, ast.Call) else None
            if isinstance(node, ast.Call) and position is not None:
                found |= texts(other, _argument(other, node, position, attribute))
    return found


def _fields(definition: ast.ClassDef) -> Sequence[str]:
    """What a class is built from: its `__init__`'s parameters after `self`,
    or a dataclass's annotated fields in order."""
    for node in definition.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return [a.arg for a in node.args.args[1:]]
    return [
        node.target.id
        for node in definition.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]
