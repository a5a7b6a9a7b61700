"""One attribute action as configured, validated as Go's ``attraction`` package validates it.

Each rule is checked on the key it is about, so an error reads
``processors::resource::attributes::0::value: action 'insert' needs one of ...``. Fields are
declared in the order their checks need: pydantic hands a field's validator only the fields
declared before it, and ``validate_default`` runs the check when the key is absent too.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig
from pycollector.pdata import to_any_value

Action = Literal["insert", "update", "upsert", "delete", "hash", "extract", "convert"]
WRITE_ACTIONS = ("insert", "update", "upsert")
KEY_PATTERN_ACTIONS = ("delete", "hash")  # may name keys by `pattern` instead of `key`
VALUE_SOURCES = ("value", "from_attribute", "from_context")


# Go's RE2 names a group (?<name>...) as well as (?P<name>...); Python knows only the latter.
# (RE2 has no lookbehind, so a Go pattern's "(?<" before a name is always a named group.)
_RE2_NAMED_GROUP = re.compile(r"\(\?<(?=[A-Za-z_])")


def go_regexp(pattern: str) -> str:
    """A Go (RE2) regular expression in Python's spelling."""
    return _RE2_NAMED_GROUP.sub("(?P<", pattern)


class ActionConfig(ComponentConfig):
    # insert: set if absent; update: set if present; upsert: set either way; delete; hash (SHA-256);
    # extract: named groups of `pattern` into attributes; convert: to `converted_type`.
    action: Action
    # extract: a Python regular expression whose every group is named, e.g. (?P<name>...).
    # delete, hash: also act on every key this expression finds a match in.
    pattern: str | None = pydantic.Field(None, validate_default=True)
    key: str | None = pydantic.Field(None, validate_default=True)
    # Where a written value comes from: exactly one of these three.
    from_attribute: str = ""
    # The client that sent the data: `client.address`, `metadata.<key>` (the otlp receiver keeps
    # request metadata with include_metadata: true), `auth.<key>` (what the receiver's
    # authenticator said of it: basicauth's `auth.username`).
    from_context: str = ""
    converted_type: Literal["int", "double", "string"] | None = pydantic.Field(None, validate_default=True)
    # insert, update, upsert: written when the source gives nothing (from_attribute or
    # from_context finding nothing); with no source, it is the value (Go's contrib v0.152+).
    default_value: Any = None
    value: Any = pydantic.Field(None, validate_default=True)

    @pydantic.field_validator("action", mode="before")
    @classmethod
    def _lower_case(cls, action: Any) -> Any:
        return action.lower() if isinstance(action, str) else action  # Go accepts INSERT too

    @pydantic.field_validator("pattern")
    @classmethod
    def _pattern_fits_action(cls, pattern: str | None, info: pydantic.ValidationInfo) -> str | None:
        action = info.data.get("action")
        if action is None:
            return pattern
        if pattern and action not in (*KEY_PATTERN_ACTIONS, "extract"):
            raise ValueError(f"action '{action}' does not use a pattern")
        pattern = go_regexp(pattern) if pattern else pattern
        try:
            compiled = re.compile(pattern or "")
        except re.error as error:
            raise ValueError(f"invalid regular expression: {error}") from None
        if action == "extract":
            if not compiled.groups:
                raise ValueError("action 'extract' needs a pattern with named groups, e.g. '(?P<name>[^/]+)'")
            if len(compiled.groupindex) != compiled.groups:
                raise ValueError("every group of an extract pattern must be named, e.g. (?P<name>...)")
        return pattern

    @pydantic.field_validator("key")
    @classmethod
    def _key_present(cls, key: str | None, info: pydantic.ValidationInfo) -> str | None:
        action = info.data.get("action")
        if key or action is None:
            return key
        if action in KEY_PATTERN_ACTIONS:
            if not info.data.get("pattern"):
                raise ValueError(f"action '{action}' needs a key or a pattern")
            return key
        raise ValueError(f"required by action '{action}'")

    @pydantic.field_validator("converted_type")
    @classmethod
    def _type_fits_action(cls, converted_type: str | None, info: pydantic.ValidationInfo) -> str | None:
        action = info.data.get("action")
        if action == "convert" and not converted_type:
            raise ValueError("required by action 'convert': int, double or string")
        if action not in (None, "convert") and converted_type:
            raise ValueError(f"action '{action}' does not use converted_type")
        return converted_type

    @pydantic.field_validator("value")
    @classmethod
    def _one_value_source(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        action = info.data.get("action")
        if action is None:
            return value
        given = {"value": value, **info.data}
        sources = [name for name in VALUE_SOURCES if given.get(name) not in (None, "")]
        choices, given_here = "value, from_attribute or from_context", " and ".join(sources)
        if action in WRITE_ACTIONS and not sources and info.data.get("default_value") is None:
            raise ValueError(f"action '{action}' needs one of {choices} (or default_value)")
        if action in WRITE_ACTIONS and len(sources) > 1:
            raise ValueError(f"set only one of {choices}; this action sets {given_here}")
        if action not in WRITE_ACTIONS and sources:
            raise ValueError(f"action '{action}' does not use {choices}; this action sets {given_here}")
        if value is not None:
            try:
                to_any_value(value)
            except TypeError as error:
                raise ValueError(str(error)) from None
        return value
