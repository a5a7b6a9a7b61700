"""The attributes processor: attribute actions on each span, log record, metric data point and
profile sample that include/exclude let through.

Profile samples keep their attributes in the message's dictionary (``attribute_table``) and refer
to them by index. Many samples share one set of indices, so each distinct set is decoded and acted
on once per resource; a set that changed is re-interned through a ``ProfilesBuilder`` wrapping the
message, which appends only attribute entries it does not hold yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf.message import Message

from pycollector.component import Component, Consumer
from pycollector.pdata import ProfilesBuilder, from_any_value, signal_of, to_dict

from processors.attraction.actions import AttributeActions
from processors.attributes.config import AttributesConfig
from processors.attributes.matching import Filter

# Where each signal keeps its items: resource entries, scope entries, items.
_ITEM_PATHS = {
    "traces": ("resource_spans", "scope_spans", "spans"),
    "logs": ("resource_logs", "scope_logs", "log_records"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
}


class AttributesProcessor(Component):
    def __init__(self, settings, config: AttributesConfig, next_consumer: Consumer):
        self._log = settings.logger
        self._actions = AttributeActions(config.actions)
        self._filter = Filter(config.include, config.exclude)
        self._next = next_consumer

    def start(self, host) -> None:
        self._actions.log_limits(self._log, "actions")

    def consume(self, data: Any) -> None:
        if self._actions:
            signal = signal_of(data)
            if signal == "profiles":
                self._act_on_samples(data)
            else:
                for resource, attributes in _item_attributes(data, signal):
                    self._act_on(resource, attributes)
        self._next.consume(data)

    def _act_on(self, resource: Message, attributes: Any) -> None:
        if self._filter and not self._filter.lets_through(to_dict(resource.attributes), to_dict(attributes)):
            return
        self._actions.apply_to_key_values(attributes)

    def _act_on_samples(self, data: Message) -> None:
        samples = _SampleAttributes(data, self._actions, self._filter)
        for resource_profiles in data.resource_profiles:
            resource = to_dict(resource_profiles.resource.attributes)
            rewritten: dict[tuple[int, ...], list[int] | None] = {}
            for scope_profiles in resource_profiles.scope_profiles:
                for profile in scope_profiles.profiles:
                    for sample in profile.samples:
                        indices = tuple(sample.attribute_indices)
                        if indices not in rewritten:
                            rewritten[indices] = samples.act_on(resource, indices)
                        if rewritten[indices] is not None:
                            sample.attribute_indices[:] = rewritten[indices]


class _SampleAttributes:
    """Acts on sets of attributes in one message's dictionary, re-interning what changed."""

    def __init__(self, data: Message, actions: AttributeActions, filter_: Filter) -> None:
        self._data = data
        self._actions = actions
        self._filter = filter_
        self._builder: ProfilesBuilder | None = None  # made on the first change

    def act_on(self, resource: dict[str, Any], indices: tuple[int, ...]) -> list[int] | None:
        """The indices of the set after the actions, or None when they leave it as it was."""
        dictionary = self._data.dictionary
        strings = dictionary.string_table
        entries = [dictionary.attribute_table[index] for index in indices]
        attributes = {strings[e.key_strindex]: from_any_value(e.value) for e in entries}
        if self._filter and not self._filter.lets_through(resource, attributes):
            return None
        if not self._actions.apply(attributes):
            return None
        units = {strings[e.key_strindex]: strings[e.unit_strindex] for e in entries}
        if self._builder is None:
            self._builder = ProfilesBuilder(self._data)
        return [self._builder.attribute(key, value, units.get(key, "")) for key, value in attributes.items()]


def _item_attributes(data: Message, signal: str) -> Iterator[tuple[Message, Any]]:
    """(resource, the item's ``repeated KeyValue`` attributes) for each span, record or point."""
    resources, scopes, items = _ITEM_PATHS[signal]
    for resource_entry in getattr(data, resources):
        for scope_entry in getattr(resource_entry, scopes):
            for item in getattr(scope_entry, items):
                if signal != "metrics":
                    yield resource_entry.resource, item.attributes
                    continue
                kind = item.WhichOneof("data")
                for point in getattr(item, kind).data_points if kind else ():
                    yield resource_entry.resource, point.attributes
