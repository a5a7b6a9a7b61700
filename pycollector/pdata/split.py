"""Cut a message in two by item count, keeping every item whole.

The batch processor sends at most ``send_batch_max_size`` items at a time: it cuts that many off
the front of what it holds and keeps the rest. Items are what ``item_count`` counts: profile
samples, spans, metric data points, log records. The containers an item sits in (resource,
scope, profile or metric) are repeated on each side of a cut that passes through them.

Profiles: each side gets a dictionary of its own, holding only what its samples and profiles
refer to, re-interned through a fresh ``ProfilesBuilder``; so each side is valid on its own and
carries no entries it does not use. A cut that takes every item, or none, copies nothing: the
message itself is that side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import Message
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.builder import ProfilesBuilder
from pycollector.pdata.counting import item_count, signal_of
from pycollector.pdata.merging import Reinterner


def split_at(message: Message, count: int) -> tuple[Message, Message]:
    """``(head, tail)``: messages of ``message``'s type with its first ``count`` items and the
    rest, in their original order. Containers without items go with the head while it still has
    room, else with the tail. When the cut takes every item (or none), that side is ``message``
    itself, containers without items and all, and the other a new empty message.

    Raises IndexError when a profile refers outside its own dictionary (see ``validate_indices``).
    """
    signal = signal_of(message)
    if count >= item_count(message):
        return message, type(message)()
    if count <= 0:
        return type(message)(), message
    if signal == "profiles":
        return _split_profiles(message, count)
    head, tail = type(message)(), type(message)()
    _split_level(message, head, tail, _TREE_PATHS[signal], count)
    return head, tail


def _copy_fields(source: Message, target: Message, skip: str) -> None:
    """Copy every set field but ``skip`` (the big repeated one, which the caller fills itself)."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


# -- traces, metrics, logs: a tree of repeated fields down to the items -------------------------


class _Field:
    """One step down the tree: a repeated field of messages."""

    def __init__(self, name: str) -> None:
        self.name = name

    def children(self, parent: Message) -> Sequence[Message]:
        return getattr(parent, self.name)

    def children_of_copy(self, parent_copy: Message, parent: Message) -> Any:
        return getattr(parent_copy, self.name)

    def copy_shell(self, parent: Message, parent_copy: Message) -> None:
        _copy_fields(parent, parent_copy, skip=self.name)


class _DataPoints(_Field):
    """A metric keeps its points in whichever of gauge, sum, histogram, ... it is."""

    def __init__(self) -> None:
        super().__init__("data_points")

    def children(self, metric: Message) -> Sequence[Message]:
        kind = metric.WhichOneof("data")
        return getattr(metric, kind).data_points if kind else ()

    def children_of_copy(self, metric_copy: Message, metric: Message) -> Any:
        return getattr(metric_copy, metric.WhichOneof("data")).data_points

    def copy_shell(self, metric: Message, metric_copy: Message) -> None:
        kind = metric.WhichOneof("data")
        _copy_fields(metric, metric_copy, skip=kind)
        # Gauge has nothing but its points: mark the oneof set before any point is added.
        getattr(metric_copy, kind).SetInParent()
        _copy_fields(getattr(metric, kind), getattr(metric_copy, kind), skip=self.name)


_TREE_PATHS: dict[str, tuple[_Field, ...]] = {
    "traces": (_Field("resource_spans"), _Field("scope_spans"), _Field("spans")),
    "logs": (_Field("resource_logs"), _Field("scope_logs"), _Field("log_records")),
    "metrics": (
        _Field("resource_metrics"),
        _Field("scope_metrics"),
        _Field("metrics"),
        _DataPoints(),
    ),
}


def _items_in(message: Message, path: tuple[_Field, ...]) -> int:
    if not path:
        return 1
    step, deeper = path[0], path[1:]
    return sum(_items_in(child, deeper) for child in step.children(message))


def _split_level(
    source: Message, head: Message, tail: Message, path: tuple[_Field, ...], room: int
) -> int:
    """Distribute ``source``'s children between ``head`` and ``tail``; returns the room left."""
    step, deeper = path[0], path[1:]
    for child in step.children(source):
        size = _items_in(child, deeper)
        if room > 0 and size <= room:
            step.children_of_copy(head, source).add().CopyFrom(child)
            room -= size
        elif room == 0:
            step.children_of_copy(tail, source).add().CopyFrom(child)
        else:  # the cut falls inside this child
            head_child = step.children_of_copy(head, source).add()
            tail_child = step.children_of_copy(tail, source).add()
            deeper[0].copy_shell(child, head_child)
            deeper[0].copy_shell(child, tail_child)
            room = _split_level(child, head_child, tail_child, deeper, room)
    return room


# -- profiles: samples refer to a dictionary that each side must carry its own part of ----------


class _ProfilesSide:
    """One side of a cut: a fresh message, and where each source container was copied to."""

    def __init__(self, source: Message) -> None:
        self.builder = ProfilesBuilder(type(source)())
        self._reintern = Reinterner(source.dictionary, self.builder)
        self._resources: dict[int, profiles_pb2.ResourceProfiles] = {}
        self._scopes: dict[tuple[int, int], profiles_pb2.ScopeProfiles] = {}

    def resource(
        self, r: int, source: profiles_pb2.ResourceProfiles
    ) -> profiles_pb2.ResourceProfiles:
        copy = self._resources.get(r)
        if copy is None:
            copy = self._resources[r] = self.builder.data.resource_profiles.add()
            _copy_fields(source, copy, skip="scope_profiles")
        return copy

    def scope(
        self,
        r: int,
        resource: profiles_pb2.ResourceProfiles,
        s: int,
        source: profiles_pb2.ScopeProfiles,
    ) -> profiles_pb2.ScopeProfiles:
        copy = self._scopes.get((r, s))
        if copy is None:
            copy = self._scopes[(r, s)] = self.resource(r, resource).scope_profiles.add()
            _copy_fields(source, copy, skip="profiles")
        return copy

    def profile(
        self,
        scope_copy: profiles_pb2.ScopeProfiles,
        source: profiles_pb2.Profile,
        samples: Sequence[profiles_pb2.Sample],
    ) -> None:
        copy = scope_copy.profiles.add()
        _copy_fields(source, copy, skip="samples")
        copy.samples.extend(samples)
        self._reintern.profile(copy)


def _split_profiles(data: Message, count: int) -> tuple[Message, Message]:
    head, tail = _ProfilesSide(data), _ProfilesSide(data)
    room = count
    for r, resource in enumerate(data.resource_profiles):
        if not resource.scope_profiles:
            (head if room > 0 else tail).resource(r, resource)
        for s, scope in enumerate(resource.scope_profiles):
            if not scope.profiles:
                (head if room > 0 else tail).scope(r, resource, s, scope)
            for profile in scope.profiles:
                samples = profile.samples
                cut = min(len(samples), room)
                if cut or room > 0:
                    head.profile(head.scope(r, resource, s, scope), profile, samples[:cut])
                if cut < len(samples) or room == 0:
                    tail.profile(tail.scope(r, resource, s, scope), profile, samples[cut:])
                room -= cut
    return head.builder.data, tail.builder.data
