"""The validator's recompute checks, read from the installed Megatron Core's own source.

``matrix --check`` samples a configuration space; a check the space never reaches is a check nobody
compares. So the space is not only listed by hand (``harness.matrix.space``): every condition of
``__post_init__`` (of ``TransformerConfig``, ``MLATransformerConfig`` and the parallel config they
extend, and every ``self._method()`` those call) that guards a ``raise`` or an ``assert`` about recompute
(it reads a ``recompute_*`` field, or its message says "recompute") is parsed here, with the config
fields its conditions read and the values they compare those fields with. Fields read through a
local variable count too (``offload = set(self.offload_modules)``, then ``if offload & {...}``).

From that the space derives an option for every field a check reads that no listed option sets, and
the drift report names the ones no value can be derived for (``harness.matrix.drift``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any

from harness.config.validate import config_classes

# A method's local variables, by name: the expression last assigned to each.
Locals = dict[str, ast.expr]


@dataclass(frozen=True)
class RecomputeCheck:
    """One ``raise`` / ``assert`` of the validator about recompute."""

    where: str  # "TransformerConfig.__post_init__:1784" (the line in the installed file)
    reads: tuple[str, ...]  # config fields its conditions read, sorted
    message: str  # its message's literal text (f-string expressions dropped)
    # Per field it reads (``recompute_*`` aside): the non-default values its conditions compare the
    # field with, else those its type allows (``bool``, ``Literal``); empty when none can be derived.
    values: tuple[tuple[str, tuple[Any, ...]], ...]


def _is_self_field(node: ast.AST, names: frozenset[str]) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr in names
    ):
        return node.attr
    return None


def _constants(node: ast.AST) -> list[Any]:
    """Literal scalars of a constant, or of a tuple / list / set of them."""
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [item.value for item in node.elts if isinstance(item, ast.Constant)]
    return []


class _Reader:
    """Walks one method's body in order, following locals and ``self._method()`` calls."""

    def __init__(self, config_class: type, names: frozenset[str]) -> None:
        self.config_class = config_class
        self.names = names
        self.checks: list[RecomputeCheck] = []
        self.compared: dict[str, list[Any]] = {}
        self.visited: set[str] = set()

    def read_method(self, method_name: str) -> None:
        if method_name in self.visited:
            return
        self.visited.add(method_name)
        function = getattr(self.config_class, method_name, None)
        if function is None or not inspect.isfunction(function):
            return
        lines, first_line = inspect.getsourcelines(function)
        definition = ast.parse(textwrap.dedent("".join(lines))).body[0]
        if not isinstance(definition, ast.FunctionDef):
            return
        owner = function.__qualname__.split(".")[0]
        self._block(definition.body, [], {}, f"{owner}.{method_name}", first_line - 1)

    def _reads(self, node: ast.AST, local: Locals) -> set[str]:
        read: set[str] = set()
        for child in ast.walk(node):
            if (name := _is_self_field(child, self.names)) is not None:
                read.add(name)
            elif isinstance(child, ast.Name) and child.id in local:
                read |= self._reads(local[child.id], {})
        return read

    def _compared_field(self, side: ast.expr, local: Locals) -> set[str]:
        """The field a comparison's side is: ``self.field``, a local holding it, or ``set(...)`` of it."""
        if isinstance(side, ast.Call) and isinstance(side.func, ast.Name) and side.func.id == "set":
            side = side.args[0] if side.args else side
        if isinstance(side, ast.Name) and side.id in local:
            return self._compared_field(local[side.id], {})
        name = _is_self_field(side, self.names)
        return set() if name is None else {name}

    def _note_values(self, node: ast.AST, local: Locals) -> None:
        """The constants a condition compares each field with (directly or through a local)."""
        referenced = [
            local[child.id]
            for child in ast.walk(node)
            if isinstance(child, ast.Name) and child.id in local
        ]
        for part in (node, *referenced):
            for child in ast.walk(part):
                if isinstance(child, ast.Compare):
                    sides = [child.left, *child.comparators]
                    for side in sides:
                        for other in sides:
                            for value in _constants(other):
                                for name in self._compared_field(side, local):
                                    self._compare(name, value, child.ops[0])
                elif isinstance(child, ast.BinOp):  # ``{"a", "b"} & set(self.field)``
                    for a, b in ((child.left, child.right), (child.right, child.left)):
                        for name in self._compared_field(b, local):
                            self.compared.setdefault(name, []).extend(
                                [value] for value in _constants(a)
                            )

    def _values(self, name: str) -> tuple[Any, ...]:
        default = _default(self.config_class, name)
        values: list[Any] = []
        for value in [*self.compared.get(name, []), *_typed_values(self.config_class, name)]:
            if value is not None and value != default and value not in values:
                values.append(value)
        return tuple(values)

    def _compare(self, name: str, value: Any, op: ast.cmpop) -> None:
        values = self.compared.setdefault(name, [])
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(value, str):
                values.append([value] if _is_list_field(self.config_class, name) else value)
            else:
                values.append(value)
        elif isinstance(op, ast.Gt):
            values.append(value + 1)
        elif isinstance(op, ast.Lt):
            values.append(value - 1)
        else:
            values.append(value)

    def _block(
        self,
        body: list[ast.stmt],
        conditions: list[ast.expr],
        local: Locals,
        where: str,
        offset: int,
    ) -> None:
        for statement in body:
            if isinstance(statement, ast.If):
                self._block(statement.body, [*conditions, statement.test], local, where, offset)
                negated = ast.UnaryOp(ast.Not(), statement.test)
                self._block(statement.orelse, [*conditions, negated], local, where, offset)
            elif isinstance(statement, (ast.Raise, ast.Assert)):
                tests = [
                    *conditions,
                    *([statement.test] if isinstance(statement, ast.Assert) else []),
                ]
                read = set().union(*(self._reads(test, local) for test in tests))
                message = " ".join(
                    node.value
                    for node in ast.walk(statement)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                )
                if "recompute" in message or any("recompute" in name for name in read):
                    self.compared = {}
                    for test in tests:
                        self._note_values(test, local)
                    values = tuple(
                        (name, self._values(name))
                        for name in sorted(read)
                        if not name.startswith("recompute_")
                    )
                    self.checks.append(
                        RecomputeCheck(
                            f"{where}:{statement.lineno + offset}",
                            tuple(sorted(read)),
                            message,
                            values,
                        )
                    )
            elif isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        local[target.id] = statement.value
            else:
                for call in _self_calls(statement):
                    self.read_method(call)
                for nested in _nested_bodies(statement):
                    self._block(nested, conditions, local, where, offset)


def _self_calls(statement: ast.stmt) -> Iterator[str]:
    for node in ast.walk(statement):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ):
            yield node.func.attr


def _nested_bodies(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        body = getattr(statement, name, None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            yield body
    for handler in getattr(statement, "handlers", []):
        yield handler.body


def _annotation(config_class: type, name: str) -> Any:
    return typing.get_type_hints(config_class).get(name)


def _is_list_field(config_class: type, name: str) -> bool:
    return any(
        typing.get_origin(arg) is list
        for arg in (
            _annotation(config_class, name),
            *typing.get_args(_annotation(config_class, name)),
        )
    )


def _default(config_class: type, name: str) -> Any:
    for item in fields(config_class):
        if item.name == name:
            if item.default is not MISSING:
                return item.default
            if item.default_factory is not MISSING:
                return item.default_factory()
    return None


def _typed_values(config_class: type, name: str) -> list[Any]:
    """Values the field's type allows: ``bool`` and ``Literal`` fields (optional or not)."""
    annotation = _annotation(config_class, name)
    args = [annotation, *typing.get_args(annotation)]
    if bool in args:
        return [True, False]
    for arg in args:
        if typing.get_origin(arg) is typing.Literal:
            return list(typing.get_args(arg))
    return []


@cache
def recompute_checks() -> tuple[RecomputeCheck, ...]:
    """Every recompute check of the installed validator, in source order per method."""
    checks: dict[str, RecomputeCheck] = {}
    for config_class in config_classes():
        names = frozenset(item.name for item in fields(config_class))
        # Each class's own ``__post_init__`` (they chain through ``super()``), most derived first.
        for owner in config_class.__mro__:
            if "__post_init__" in vars(owner):
                reader = _Reader(owner, names)
                reader.read_method("__post_init__")
                for check in reader.checks:
                    checks.setdefault(check.where, check)
    return tuple(checks.values())
