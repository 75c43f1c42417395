"""The typed-JSON validator: a model's annotations and field rules are the schema it checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Literal, Required, TypedDict

import pytest

from harness.errors import UsageError
from harness.typed_json import NON_NEGATIVE, ObjectShape, check_json, part_of, rules


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Note(TypedDict, total=False):
    text: Required[str]
    author: str | None


@dataclass
class Item:
    id: int = field(metadata=rules(minimum=0))
    colour: str = field(metadata=rules(one_of=Colour))
    tags: tuple[str, ...] = field(default=(), metadata=rules(unique=True))


@dataclass
class Box:
    name: str
    items: list[Item] = field(metadata=rules(unique_by="id"))
    weight: float | None = field(metadata=rules(key="weight_kg", minimum=0))
    sealed: bool
    mode: Literal["fast", "slow"]
    labels: dict[str, int] = field(default_factory=dict)
    note: dict[str, str | None] | None = field(default=None, metadata=rules(shape=Note | None))
    comment: str = field(default="", metadata=rules(required=True, empty=True))


def _box(**changes):
    box = {
        "name": "b",
        "items": [{"id": 0, "colour": "red"}, {"id": 1, "colour": "blue", "tags": ["x"]}],
        "weight_kg": 2,
        "sealed": False,
        "mode": "fast",
        "comment": "",
    }
    box.update(changes)
    return box


def _problem(value, shape=Box) -> str:
    with pytest.raises(UsageError) as caught:
        check_json(shape, value, "f.json")
    return str(caught.value)


def test_a_value_of_the_model_passes_and_defaulted_keys_are_optional():
    check_json(Box, _box(), "f.json")
    check_json(Box, _box(labels={"a": 1}, note={"text": "hi", "author": None}), "f.json")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"weight_kg": True}, "f.json: weight_kg: expected a finite number, got True"),
        ({"weight_kg": -1.5}, "f.json: weight_kg: expected a number >= 0.0, got -1.5"),
        ({"sealed": 0}, "f.json: sealed: expected true or false, got 0"),
        ({"name": ""}, "f.json: name: expected a non-empty string, got ''"),
        ({"mode": "medium"}, "f.json: mode: 'medium' is not one of fast, slow"),
        ({"labels": {"a": 1.0}}, "f.json: labels.a: expected an integer, got 1.0"),
        ({"note": {"author": "me"}}, "f.json: note: missing text"),
        ({"surprise": 1}, "f.json: $: unknown key(s) surprise"),
        (
            {"items": [{"id": 0, "colour": "green"}]},
            "f.json: items[0].colour: 'green' is not one of red, blue",
        ),
        (
            {"items": [{"id": 0, "colour": "red", "tags": ["x", "x"]}]},
            "f.json: items[0].tags: duplicated value in ['x', 'x']",
        ),
        (
            {"items": [{"id": 3, "colour": "red"}, {"id": 3, "colour": "blue"}]},
            "f.json: items[1]: duplicated row for id 3",
        ),
        (
            {"items": [{"id": -1, "colour": "red"}]},
            "f.json: items[0].id: expected an integer >= 0, got -1",
        ),
    ],
)
def test_a_problem_is_one_line_naming_its_path(changes, message):
    assert _problem(_box(**changes)) == message


def test_a_required_key_with_a_default_is_still_required():
    box = _box()
    del box["comment"], box["sealed"]
    assert _problem(box) == "f.json: $: missing sealed, comment"


def test_paths_below_a_checked_value_start_at_its_path():
    with pytest.raises(UsageError, match=r"^f: box\.items\[0\]: expected an object, got int$"):
        check_json(Box, _box(items=[1]), "f", "box")


def test_shapes_no_class_declares():
    shape = ObjectShape((("count", Annotated[int, NON_NEGATIVE], True), ("x", str, False)))
    check_json(shape, {"count": 0}, "f")
    assert _problem({"count": -1}, shape) == "f.json: count: expected an integer >= 0, got -1"
    assert (
        _problem({"id": "0"}, part_of(Item, ("id",))) == "f.json: id: expected an integer, got '0'"
    )


def test_a_shape_it_cannot_check_is_a_programming_error():
    with pytest.raises(TypeError, match="no JSON check"):
        check_json(set[int], [], "f")
