"""`pod_association`: which pod a resource came from.

Each rule is a list of sources that must all be present on the resource; the first rule whose
sources are all present decides, and its values must then match a pod exactly (a later rule is not
tried when that pod is unknown, as in Go). Without rules, the pod IP is read from `k8s.pod.ip`,
`ip`, the address of the client that sent the data, or an IP-valued `host.name`, in that order.
A `connection` source is the client's address (`pycollector.client`), as Go's.

Both sides are reduced to the same key, an *identifier*: ((from, name, value), ...). The store
indexes every pod under the identifiers its rules can produce, so a lookup is one dict access.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Iterable

from processors.k8sattributes.config import FROM_CONNECTION, FROM_RESOURCE_ATTRIBUTE, PodAssociationConfig
from processors.k8sattributes.rules import PodRecord

Identifier = tuple[tuple[str, str, str], ...]

POD_IP = "k8s.pod.ip"
POD_UID = "k8s.pod.uid"
CONTAINER_ID = "container.id"
HOST_NAME = "host.name"
# Resource attributes whose value is a pod IP. host.name and k8s.pod.ip as in Go; `ip` (what Go
# reads without rules) and net.host.ip are ours, so rules naming them match the pod IP too.
POD_IP_ATTRIBUTES = frozenset({POD_IP, HOST_NAME, "ip", "net.host.ip"})
# Read, in this order, when no rules are configured (the client's address goes before host.name).
DEFAULT_IP_ATTRIBUTES = (POD_IP, "ip")


class Associations:
    def __init__(self, rules: list[PodAssociationConfig]):
        self.rules = [[(getattr(source, "from"), source.name if getattr(source, "from") == FROM_RESOURCE_ATTRIBUTE else "") for source in rule.sources] for rule in rules]

    def of_resource(self, attributes: dict[str, Any], client_address: str = "") -> Identifier | None:
        """The identifier a resource's attributes and the sending client's address give, or None
        when no rule can apply."""
        if not self.rules:
            host_name = _string(attributes, HOST_NAME)
            candidates = [_string(attributes, name) for name in DEFAULT_IP_ATTRIBUTES] + [client_address, host_name if _is_ip(host_name) else ""]
            value = next(filter(None, candidates), "")
            return ((FROM_CONNECTION, "", value),) if value else None
        for rule in self.rules:
            identifier = []
            for source, name in rule:
                value = _string(attributes, name) if source == FROM_RESOURCE_ATTRIBUTE else client_address
                if not value or (name == HOST_NAME and not _is_ip(value)):
                    break
                identifier.append((source, name, value))
            else:
                return tuple(identifier)
        return None

    def of_pod(self, pod: PodRecord) -> set[Identifier]:
        """Every identifier that should find this pod."""
        identifiers: set[Identifier] = set()
        for rule in self.rules:
            identifiers.update(_pod_identifiers(pod, rule))
        if pod.uid:
            identifiers.add(((FROM_RESOURCE_ATTRIBUTE, POD_UID, pod.uid),))
        if pod.ip and not pod.host_network:
            identifiers.add(((FROM_CONNECTION, "", pod.ip),))
            identifiers.add(((FROM_RESOURCE_ATTRIBUTE, POD_IP, pod.ip),))
        return identifiers


def _pod_identifiers(pod: PodRecord, rule: list[tuple[str, str]]) -> Iterable[Identifier]:
    """The identifiers one rule makes for a pod: one per container id when the rule names container.id."""
    partial: list[list[tuple[str, str, str]]] = [[]]
    for source, name in rule:
        values = _pod_values(pod, source, name)
        if not values:
            return []
        partial = [prefix + [(source, name, value)] for prefix in partial for value in values]
    return [tuple(identifier) for identifier in partial]


def _pod_values(pod: PodRecord, source: str, name: str) -> list[str]:
    if source == FROM_CONNECTION:
        # Pods on the host network share the node's IP: an IP cannot tell them apart.
        return [pod.ip] if pod.ip and not pod.host_network else []
    if name == CONTAINER_ID:
        return list(pod.containers_by_id)
    value = {"k8s.namespace.name": pod.namespace, "k8s.pod.name": pod.name, POD_UID: pod.uid}.get(name)
    if value is None:
        value = pod.ip if name in POD_IP_ATTRIBUTES else pod.attributes.get(name, "")
    return [value] if value else []


def _string(attributes: dict[str, Any], name: str) -> str:
    value = attributes.get(name)
    return value if isinstance(value, str) else ""


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
