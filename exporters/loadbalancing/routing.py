"""Each resource's routing key, and a message split into one message per backend.

``service``: the resource's service.name (a resource without one goes by "", all to one backend,
counted by the caller); ``resource``: all its attributes (sorted, hashed); ``attributes``: the
values of ``routing_attributes`` ("name=value|" each, as Go writes them). A profiles message's
dictionary goes whole with each part (its indexes stay valid)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from pycollector.pdata import signal_of
from pycollector.pdata.attributes import to_dict

RESOURCES = {"profiles": "resource_profiles", "traces": "resource_spans", "metrics": "resource_metrics", "logs": "resource_logs"}


def key_function(routing_key: str, routing_attributes: list[str]) -> Callable[[Any], str]:
    """The key of a resource (an opentelemetry.proto Resource) for ``routing_key``."""
    if routing_key == "service":
        return lambda resource: str(to_dict(resource.attributes).get("service.name", ""))
    if routing_key == "resource":
        return lambda resource: "resource/" + hashlib.sha256(repr(sorted(to_dict(resource.attributes).items())).encode()).hexdigest()[:32]
    names = list(routing_attributes)
    return lambda resource: "".join(f"{name}={to_dict(resource.attributes).get(name, '')}|" for name in names)


def split(data: Any, key_of: Callable[[Any], str], endpoint_for: Callable[[str], str | None]) -> dict[str, Any]:
    """``data``'s resources grouped by the endpoint their key goes to, one message each."""
    field = RESOURCES[signal_of(data)]
    groups: dict[str, list[Any]] = {}
    for resource_data in getattr(data, field):
        endpoint = endpoint_for(key_of(resource_data.resource))
        groups.setdefault(endpoint, []).append(resource_data)
    if len(groups) == 1:
        return {next(iter(groups)): data}  # (all of it to one: the message as it came)
    parts = {}
    for endpoint, resources in groups.items():
        part = type(data)()
        if field == "resource_profiles":
            part.dictionary.CopyFrom(data.dictionary)
        getattr(part, field).extend(resources)
        parts[endpoint] = part
    return parts
