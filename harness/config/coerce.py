"""Turn ``--set field=value`` text into a typed TransformerConfig field value, by the field's type.

Bad input (no such field, a value the type cannot hold, a type the command line cannot express)
raises ``UsageError``: one line, exit 2.
"""

from __future__ import annotations

import enum
import types
import typing
from functools import cache
from typing import Any

from harness.errors import UsageError

_NONE_WORDS = ("none", "null")
_TRUE_WORDS = ("true", "1", "yes", "on")
_FALSE_WORDS = ("false", "0", "no", "off")


@cache
def field_types(config_class: type) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def parse_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise UsageError(f"--set expects field=value, got {text!r}")
    return name.strip(), value.strip()


def coerce_field(config_class: type, name: str, text: str) -> Any:
    types_by_name = field_types(config_class)
    if name not in types_by_name:
        raise UsageError(f"--set {name}: {config_class.__name__} has no field {name!r}")
    try:
        return _coerce(text, types_by_name[name])
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--set {name}={text!r}: {exc}") from None


def _coerce(text: str, annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in _NONE_WORDS:
            return None
        errors = []
        for option in (arg for arg in args if arg is not type(None)):
            try:
                return _coerce(text, option)
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))
    if origin is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ValueError(f"expected one of {', '.join(map(str, args))}")
    if origin in (list, list):
        item = args[0] if args else str
        return [] if text == "" else [_coerce(part.strip(), item) for part in text.split(",")]
    if annotation is bool:
        if text.lower() in _TRUE_WORDS:
            return True
        if text.lower() in _FALSE_WORDS:
            return False
        raise ValueError("expected true or false")
    if annotation in (int, float, str):
        return annotation(text)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if text in annotation.__members__:
            return annotation[text]
        raise ValueError(f"expected one of {', '.join(annotation.__members__)}")
    if (
        getattr(annotation, "__module__", "") == "torch"
        and getattr(annotation, "__name__", "") == "dtype"
    ):
        import torch

        value = getattr(torch, text, None)
        if not isinstance(value, torch.dtype):
            raise ValueError("expected a torch dtype name such as bfloat16")
        return value
    raise TypeError(f"fields of type {annotation} cannot be set from the command line")
