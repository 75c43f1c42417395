"""Check parsed JSON against the typed model that reads it: the schema is the model's annotations.

``check_json(shape, value, source)`` walks ``shape`` and raises one ``UsageError`` line naming the
source and the JSON path of the first problem (``metrics.ranks[0].peaks[1].allocated_bytes: ...``).
A shape is a type as the models annotate it:

- ``int``, ``float`` (an integer is a number; finite only: files never hold NaN), ``str`` (non-empty
  unless ``Rules.empty``), ``bool`` (never a number, nor a number a bool), ``Any`` (anything);
- ``X | None``, ``list[X]``, ``tuple[X, ...]`` (a JSON array), ``dict[str, X]``, ``Literal[...]``;
- a dataclass or ``TypedDict`` (an object: a field without a default is a required key, one with a
  default an optional key, any other key is refused), or an ``ObjectShape`` (keys a registry lists);
- ``Annotated[X, Rules(...)]``, and on a dataclass field ``field(metadata=rules(...))``: the field's
  constraints (a minimum, a closed set, another JSON key, ...), declared once, next to its type; an
  array's or a mapping's value rules apply to its items.

Checkers are compiled once per shape and paths spelled out only when a check fails: validating
keeps the strict load of 1,000 records as fast as the hand-written checks it replaced
(benchmarks/analysis_1000.py).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from harness.errors import UsageError

# The key of a dataclass field's metadata that holds its ``Rules``.
RULES_KEY = "json"

Check = Callable[[Any], None]


@dataclass(frozen=True)
class Rules:
    """What a JSON value must be beyond its type."""

    key: str | None = None  # the JSON key, when it is not the field's name
    required: bool | None = None  # None: required iff the field has no default
    minimum: float | None = None
    one_of: tuple[str, ...] = ()  # a closed set of strings
    empty: bool = False  # a string may be ""
    unique: bool = False  # an array of scalars holds each value once
    unique_by: str | None = None  # an array of objects holds one object per value of this key
    # The JSON shape, where the field's Python type is looser (a dict that holds a fixed set of keys)
    # or laid out differently (a value flattened into its parent's keys).
    shape: Any = None


def rules(
    *,
    key: str | None = None,
    required: bool | None = None,
    minimum: float | None = None,
    one_of: type[StrEnum] | tuple[str, ...] = (),
    empty: bool = False,
    unique: bool = False,
    unique_by: str | None = None,
    shape: Any = None,
) -> dict[str, Rules]:
    """A dataclass field's metadata: ``field(metadata=rules(minimum=0))``. A closed set may be given
    as its ``StrEnum`` (harness.record.vocabulary): its members' values, in declaration order."""
    values = one_of if isinstance(one_of, tuple) else tuple(member.value for member in one_of)
    return {
        RULES_KEY: Rules(key, required, minimum, values, empty, unique, unique_by, shape),
    }


NO_RULES = Rules()
NON_NEGATIVE = Rules(minimum=0)


@dataclass(frozen=True)
class ObjectShape:
    """An object whose keys no class declares (e.g. one key per metric of a registry)."""

    members: tuple[tuple[str, Any, bool], ...]  # (key, shape, required), in the order checked


class ShapeError(Exception):
    """A failed check, with the keys and indexes from the failing value up to the checked one."""

    def __init__(self, problem: str, trail: tuple[str | int, ...] = ()) -> None:
        super().__init__(problem)
        self.problem = problem
        self.trail: list[str | int] = list(trail)


def check_json(shape: Any, value: Any, source: str, path: str = "", name: str = "$") -> None:
    """Raise ``UsageError`` (``source: path: problem``) unless ``value`` has ``shape``.

    ``path`` is where ``value`` sits in its document ("" for the document itself, whose own problems
    are reported under ``name``)."""
    try:
        checker(shape)(value)
    except ShapeError as error:
        raise UsageError(f"{source}: {_spell(path, error.trail) or name}: {error.problem}")


def _spell(path: str, trail: list[str | int]) -> str:
    for step in reversed(trail):
        path = f"{path}[{step}]" if isinstance(step, int) else f"{path}.{step}" if path else step
    return path


def type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def checker(shape: Any, constraint: Rules = NO_RULES) -> Check:
    """The compiled check of ``shape`` (one per shape and rules: ``_compile`` caches them)."""
    if get_origin(shape) is Annotated:
        shape, *extras = get_args(shape)
        # Nested ``Annotated`` flatten, innermost first: the outermost rules (a field's) win.
        constraint = ([constraint] + [extra for extra in extras if isinstance(extra, Rules)])[-1]
    return _compile(shape, constraint)


@cache
def _compile(shape: Any, constraint: Rules) -> Check:
    if constraint.shape is not None:
        return checker(constraint.shape, dataclasses.replace(constraint, shape=None))
    origin, args = get_origin(shape), get_args(shape)
    nullable = origin in (Union, types.UnionType) and type(None) in args
    if nullable:
        rest = tuple(arg for arg in args if arg is not type(None))
        shape = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007
        origin, args = get_origin(shape), get_args(shape)
    if shape is int:  # scalars take null themselves: the bulk of a record is nullable integers
        return _integer(constraint.minimum, nullable)
    if shape is float or (origin in (Union, types.UnionType) and set(args) == {int, float}):
        return _number(constraint.minimum, nullable)
    if shape is str:
        return _string(constraint.one_of, constraint.empty, nullable)
    if origin is Literal:
        return _string(tuple(str(arg) for arg in args), False, nullable)
    if nullable:
        inner = checker(shape, constraint)
        return lambda value: None if value is None else inner(value)
    if shape is bool:
        return _check_bool
    if shape is Any:
        return lambda value: None
    # A container's value rules (a minimum, a closed set, ...) are its items'.
    items = Rules(minimum=constraint.minimum, one_of=constraint.one_of, empty=constraint.empty)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return _array(checker(args[0], items), constraint)
    if origin is dict and args[0] is str:
        return _mapping(checker(args[1], items))
    if isinstance(shape, ObjectShape):
        return _object(shape.members)
    if isinstance(shape, type) and dataclasses.is_dataclass(shape):
        return _object(_dataclass_members(shape))
    if is_typeddict(shape):
        return _object(_typeddict_members(shape))
    raise TypeError(f"no JSON check for {shape!r}")


def _typeddict_members(cls: Any) -> tuple[tuple[str, Any, bool], ...]:
    # From the annotations, not ``__required_keys__``: under ``from __future__ import annotations``
    # the class sees ``Required[...]`` as a string and counts every key of a total=False class optional.
    members = []
    for key, hint in get_type_hints(cls, include_extras=True).items():
        marker = get_origin(hint)
        required = marker is Required or (cls.__total__ and marker is not NotRequired)
        members.append(
            (key, get_args(hint)[0] if marker in (Required, NotRequired) else hint, required)
        )
    return tuple(members)


def _dataclass_members(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = get_type_hints(cls, include_extras=True)
    members = []
    for field in dataclasses.fields(cls):
        constraint: Rules = field.metadata.get(RULES_KEY, NO_RULES)
        defaulted = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        required = not defaulted if constraint.required is None else constraint.required
        shape = (
            hints[field.name]
            if constraint is NO_RULES
            else Annotated[hints[field.name], constraint]
        )
        members.append((constraint.key or field.name, shape, required))
    return tuple(members)


def _object(members: tuple[tuple[str, Any, bool], ...]) -> Check:
    checks = {key: checker(shape) for key, shape, _ in members}
    required = tuple(key for key, _, needed in members if needed)
    required_keys, allowed = frozenset(required), frozenset(key for key, _, _ in members)

    def check(value: Any) -> None:
        if not isinstance(value, dict):
            raise ShapeError(f"expected an object, got {type_name(value)}")
        keys = value.keys()
        if keys != required_keys and keys != allowed:  # else: the common case, checked fast
            missing = [key for key in required if key not in value]
            if missing:
                raise ShapeError(f"missing {', '.join(missing)}")
            unknown = sorted(keys - allowed)
            if unknown:
                raise ShapeError(f"unknown key(s) {', '.join(unknown)}")
        key = ""
        try:
            for key, item in value.items():  # every key is a member's now
                checks[key](item)
        except ShapeError as error:
            error.trail.append(key)
            raise

    return check


def _array(check_item: Check, constraint: Rules) -> Check:
    unique, unique_by = constraint.unique, constraint.unique_by

    def check(value: Any) -> None:
        if not isinstance(value, list):
            raise ShapeError(f"expected an array, got {type_name(value)}")
        i = 0
        try:
            for i, item in enumerate(value):
                check_item(item)
        except ShapeError as error:
            error.trail.append(i)
            raise
        if unique and len(set(value)) != len(value):
            raise ShapeError(f"duplicated value in {value}")
        if unique_by is not None:
            seen: set[Any] = set()
            for i, item in enumerate(value):
                if item[unique_by] in seen:
                    raise ShapeError(f"duplicated row for {unique_by} {item[unique_by]}", (i,))
                seen.add(item[unique_by])

    return check


def _mapping(check_value: Check) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, dict):
            raise ShapeError(f"expected an object, got {type_name(value)}")
        key = ""
        try:
            for key, item in value.items():
                check_value(item)
        except ShapeError as error:
            error.trail.append(key)
            raise

    return check


def _check_bool(value: Any) -> None:
    if type(value) is not bool:
        raise ShapeError(f"expected true or false, got {value!r}")


def _integer(minimum: float | None, nullable: bool) -> Check:
    def check(value: Any) -> None:
        if value is None and nullable:
            return
        # Exact ints first (the bulk); bool is an int subclass: refused here.
        if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
            raise ShapeError(f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ShapeError(f"expected an integer >= {minimum}, got {value}")

    return check


def _number(minimum: float | None, nullable: bool) -> Check:
    bound = None if minimum is None else float(minimum)  # a number's bound reads as one: >= 0.0

    def check(value: Any) -> None:
        if value is None and nullable:
            return
        if (
            type(value) is not float
            and type(value) is not int
            and (not isinstance(value, int | float) or isinstance(value, bool))
        ) or not math.isfinite(value):
            raise ShapeError(f"expected a finite number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ShapeError(f"expected a number >= {bound}, got {value}")

    return check


def _string(choices: tuple[str, ...], empty: bool, nullable: bool) -> Check:
    def check(value: Any) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, str) or not (value or empty):
            what = "a string" if empty else "a non-empty string"
            raise ShapeError(f"expected {what}, got {value!r}")
        if choices and value not in choices:
            raise ShapeError(f"{value!r} is not one of {', '.join(choices)}")

    return check


def part_of(cls: type, keys: tuple[str, ...]) -> ObjectShape:
    """The members ``keys`` of dataclass ``cls``, each required: the shape of what a file keeps of
    one of the model's objects (a golden keeps a record's hardware profile, its pins, ...)."""
    members = {key: shape for key, shape, _ in _dataclass_members(cls)}
    return ObjectShape(tuple((key, members[key], True) for key in keys))
