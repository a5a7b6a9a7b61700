"""Turn pydantic's validation errors into ``path: message`` lines a person can act on."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

import pydantic

from pycollector.config.errors import join_path
from pycollector.config.types import REDACTED, holds_opaque


def describe(prefix: str, model: type[pydantic.BaseModel], error: pydantic.ValidationError) -> list[str]:
    problems = []
    for detail in error.errors(include_url=False):
        loc = tuple(detail["loc"])
        path = join_path(prefix, *loc)
        kind = detail["type"]
        if kind == "extra_forbidden":
            problems.append(f"{path}: unknown key{_suggestion(loc[-1], _keys_at(model, loc[:-1]))}")
        elif kind == "missing":
            problems.append(f"{path}: required key is missing")
        elif _opaque_at(model, loc):
            # A secret's value is never echoed, whatever is wrong with it.
            problems.append(f"{path}: {_without(_message(detail), detail.get('input'))} (got {REDACTED})")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            problems.append(f"{path}: expected a map of settings, got {_show(detail.get('input'))}")
        else:
            problems.append(f"{path}: {_message(detail)}{_got(detail)}")
    return problems


def _opaque_at(model: type[pydantic.BaseModel], loc: tuple) -> bool:
    """Whether ``loc`` inside ``model`` is, or is inside, a field holding an OpaqueString."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = _field(current, part)
        if field is None:
            # Not a key of the model (a union member's tag, a key a validator renames): when in
            # doubt, a model that holds a secret anywhere hides the value.
            return _holds_opaque_anywhere(current)
        if holds_opaque(field.annotation):
            return True
        current = _inner_model(field.annotation)
        if current is None:
            return False
    return False


def _holds_opaque_anywhere(model: type[pydantic.BaseModel], seen: frozenset = frozenset()) -> bool:
    if model in seen:
        return False
    for field in model.model_fields.values():
        inner = _inner_model(field.annotation)
        if holds_opaque(field.annotation) or (inner is not None and _holds_opaque_anywhere(inner, seen | {model})):
            return True
    return False


def _without(message: str, value: Any) -> str:
    """``message`` with any spelling of the secret ``value`` in it replaced."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        message = message.replace(repr(value), REDACTED)
        if len(str(value)) >= 3:  # shorter ones would garble the message more than they tell
            message = message.replace(str(value), REDACTED)
    return message


def suggestion(word: str, choices: typing.Iterable[str]) -> str:
    return _suggestion(word, list(choices))


def _suggestion(word: Any, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _message(detail: dict) -> str:
    message = detail["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    return message[:1].lower() + message[1:]


def _got(detail: dict) -> str:
    value = detail.get("input")
    if value is None or isinstance(value, (dict, list)) or re.search(rf"(?<![\w.]){re.escape(repr(value))}(?![\w.])", detail["msg"]):
        return ""
    return f" (got {_show(value)})"


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _keys_at(model: type[pydantic.BaseModel], loc: tuple) -> list[str]:
    """The keys a config may have at ``loc`` inside ``model`` (to suggest the closest one)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = _field(current, part)
        if field is None:
            return []
        current = _inner_model(field.annotation)
    if current is None:
        return []
    return [key for name, field in current.model_fields.items() for key in (name, field.alias) if key]


def _field(model: type[pydantic.BaseModel], key: str):
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _inner_model(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _inner_model(typing.get_args(annotation)[0])
    for argument in typing.get_args(annotation) if origin is not None or isinstance(annotation, types.UnionType) else ():
        found = _inner_model(argument)
        if found is not None:
            return found
    return None
