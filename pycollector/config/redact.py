"""The resolved config as print-config shows it: every value that lands in an opaque field
(``OpaqueString``: header values, tokens, passwords, keys) reads ``[REDACTED]``.

Which values are opaque is known from the validated models, not from the YAML, so a value that
came from ``${env:...}``, ``${file:...}`` or ``--set`` is hidden as surely as one written out. The
YAML as written (keys, spellings, order) is kept; only opaque values are replaced, by walking each
component's YAML beside its validated model (as the Go collector mirrors its redacted marshal onto
the unexpanded config). Where the two cannot be matched key for key, every value under a part of
the model that holds a secret is hidden.
"""

from __future__ import annotations

import copy
from typing import Any

import pydantic

from pycollector.component import ComponentID
from pycollector.config.types import REDACTED, OpaqueString
from pycollector.config.validate import Plan


def redacted(config: dict, plan: Plan) -> dict:
    """A copy of the loader's ``config`` with the values of opaque fields replaced."""
    result = copy.deepcopy(config)
    for (kind, component_id), spec in plan.components.items():
        section = result.get(kind)
        for raw_id in section or ():
            if str(ComponentID.parse(str(raw_id))) == component_id:
                section[raw_id] = mirror(section[raw_id], spec.config)
    service = result.get("service")
    if isinstance(service, dict) and "telemetry" in service:
        service["telemetry"] = mirror(service["telemetry"], plan.telemetry)
    return result


def mirror(raw: Any, typed: Any) -> Any:
    """``raw`` (as written) with what ``typed`` (its validated value) holds as opaque redacted."""
    if isinstance(typed, OpaqueString):
        return REDACTED
    if not holds_secret(typed):
        return raw
    if isinstance(typed, pydantic.BaseModel) and isinstance(raw, dict):
        names = _names_by_key(type(typed))
        return {key: mirror(value, getattr(typed, names[key])) if key in names else _hide_all(value) for key, value in raw.items()}
    if isinstance(typed, dict) and isinstance(raw, dict):
        return {key: mirror(value, typed[key]) if key in typed else _hide_all(value) for key, value in raw.items()}
    if isinstance(typed, (list, tuple)) and isinstance(raw, list) and len(raw) == len(typed):
        return [mirror(value, inner) for value, inner in zip(raw, typed)]
    return _hide_all(raw)


def holds_secret(value: Any) -> bool:
    """Whether a validated config value holds an OpaqueString anywhere."""
    if isinstance(value, OpaqueString):
        return True
    if isinstance(value, pydantic.BaseModel):
        return any(holds_secret(getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, dict):
        return any(holds_secret(inner) for inner in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(holds_secret(inner) for inner in value)
    return False


def _hide_all(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {key: _hide_all(value) for key, value in raw.items()}
    if isinstance(raw, list):
        return [_hide_all(value) for value in raw]
    return raw if raw is None else REDACTED


def _names_by_key(model: type[pydantic.BaseModel]) -> dict[str, str]:
    """Every key a model reads (field names and aliases) -> the field's name."""
    names: dict[str, str] = {}
    for name, field in model.model_fields.items():
        names[name] = name
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                names[alias] = name
            elif isinstance(alias, pydantic.AliasChoices):
                names.update({choice: name for choice in alias.choices if isinstance(choice, str)})
    return names
