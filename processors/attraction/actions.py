"""Apply configured attribute actions, in order, to one set of attributes.

Shared by the resource processor (resource attributes) and the attributes processor (span, log
record, data point and profile sample attributes). Attributes are a dict of Python values (see
``pycollector.pdata.to_dict``); the semantics are Go's ``attraction.AttrProc.Process``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2

import pycollector.client
from pycollector.pdata import key_values, to_dict

from processors.attraction import values
from processors.attraction.config import WRITE_ACTIONS, ActionConfig

# A compiled action: edits the attributes in place, says whether it changed anything.
Step = Callable[[dict[str, Any]], bool]


class AttributeActions:
    def __init__(self, actions: Sequence[ActionConfig]) -> None:
        self._steps = [_compile(action) for action in actions]

    def __bool__(self) -> bool:
        return bool(self._steps)

    def log_limits(self, logger: Any, setting: str) -> None:
        """Say at start when these actions will do nothing at all."""
        if not self._steps:
            logger.warning(f"no {setting} configured; data passes through unchanged")

    def apply(self, attributes: dict[str, Any]) -> bool:
        changed = False
        for step in self._steps:
            changed = step(attributes) or changed
        return changed

    def apply_to_key_values(self, attributes: MutableSequence[common_pb2.KeyValue]) -> bool:
        """Apply to an OTLP ``repeated KeyValue``, rewriting it only when something changed."""
        as_dict = to_dict(attributes)
        if not self.apply(as_dict):
            return False
        del attributes[:]
        attributes.extend(key_values(as_dict))
        return True


def _compile(action: ActionConfig) -> Step:
    if action.action in WRITE_ACTIONS:
        return _writer(action)
    pattern = re.compile(action.pattern) if action.pattern else None
    if action.action == "extract":
        return lambda attributes: _extract(attributes, action.key, pattern)
    if action.action == "convert":
        return lambda attributes: _convert(attributes, action.key, action.converted_type)
    edit = _delete if action.action == "delete" else _hash
    return lambda attributes: edit(attributes, _keys_named(attributes, action.key, pattern))


def _writer(action: ActionConfig) -> Step:
    def write(attributes: dict[str, Any]) -> bool:
        if action.value is not None:
            value = action.value
        elif action.from_context and (found := context_value(action.from_context)) is not None:
            value = found
        elif action.from_attribute and action.from_attribute in attributes:
            value = attributes[action.from_attribute]
        elif action.default_value is not None:
            value = action.default_value  # (the source gave nothing)
        else:
            return False
        present = action.key in attributes
        if (action.action == "insert" and present) or (action.action == "update" and not present):
            return False
        # A list or map value must not be shared between two attributes (or with the config).
        attributes[action.key] = copy.deepcopy(value)
        return True

    return write


def context_value(key: str) -> Any:
    """What ``from_context`` names, from the client that sent the data being handled (Go's
    semantics): ``client.address``, ``metadata.<key>`` or a bare metadata key. One value is a
    string, several a list. ``auth.<key>``: what the receiver's authenticator said of the client
    (basicauth's ``auth.username``)."""
    client = pycollector.client.current()
    if key == "client.address":
        found = (client.address,) if client.address else ()
    elif key.startswith("auth."):
        value = client.auth.get(key.removeprefix("auth."))
        found = (value,) if value else ()
    else:
        found = client.get(key.removeprefix("metadata."))
    if not found:
        return None
    return found[0] if len(found) == 1 else list(found)


def _keys_named(attributes: dict[str, Any], key: str, pattern: re.Pattern | None) -> list[str]:
    named = [key] if key in attributes else []
    if pattern is not None:
        named += [name for name in attributes if name != key and pattern.search(name)]
    return named


def _delete(attributes: dict[str, Any], keys: list[str]) -> bool:
    for key in keys:
        del attributes[key]
    return bool(keys)


def _hash(attributes: dict[str, Any], keys: list[str]) -> bool:
    for key in keys:
        attributes[key] = values.hash_value(attributes[key])
    return bool(keys)


def _extract(attributes: dict[str, Any], key: str, pattern: re.Pattern) -> bool:
    value = attributes.get(key)
    match = pattern.search(value) if isinstance(value, str) else None
    if match is None:
        return False
    for name in pattern.groupindex:
        attributes[name] = match.group(name) or ""  # Go puts "" for a group that matched nothing
    return True


def _convert(attributes: dict[str, Any], key: str, to: str) -> bool:
    if key not in attributes:
        return False
    attributes[key] = values.convert(attributes[key], to)
    return True
