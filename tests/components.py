"""In-process components for engine tests: they record what happens to them, in order."""

from __future__ import annotations

from typing import Any

from pycollector.component import Component, ComponentConfig, Factory, RefusedError, StartError
from pycollector.pdata import ProfilesBuilder


class Journal:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.received: dict[str, list[Any]] = {}
        self.fail_start: set[str] = set()
        self.refuse: set[str] = set()

    def note(self, what: str, who: str) -> None:
        self.events.append((what, who))

    def of(self, what: str) -> list[str]:
        return [who for event, who in self.events if event == what]


class RecorderConfig(ComponentConfig):
    pass


class Recorder(Component):
    """A receiver that pushes whatever the test hands to ``push``."""

    def __init__(self, journal, name, next_consumer):
        self.journal, self.name, self.next_consumer = journal, name, next_consumer

    def start(self, host):
        if self.name in self.journal.fail_start:
            raise StartError("port already in use")
        self.journal.note("start", self.name)

    def push(self, data):
        self.next_consumer.consume(data)

    def shutdown(self):
        self.journal.note("shutdown", self.name)


class TaggerConfig(ComponentConfig):
    value: str = "tagged"


class Tagger(Component):
    """A processor that edits data in place: adds a resource attribute to every profile resource."""

    def __init__(self, journal, name, config, next_consumer):
        self.journal, self.name, self.config, self.next_consumer = journal, name, config, next_consumer

    def start(self, host):
        self.journal.note("start", self.name)

    def consume(self, data):
        for resource_profiles in data.resource_profiles:
            attribute = resource_profiles.resource.attributes.add()
            attribute.key, attribute.value.string_value = f"tag.{self.name}", self.config.value
        self.next_consumer.consume(data)

    def shutdown(self):
        self.journal.note("shutdown", self.name)


class Keeper(Component):
    """An exporter (or connector) that keeps what it receives."""

    def __init__(self, journal, name, next_consumer=None):
        self.journal, self.name, self.next_consumer = journal, name, next_consumer

    def start(self, host):
        if self.name in self.journal.fail_start:
            raise StartError("backend unreachable")
        self.journal.note("start", self.name)

    def consume(self, data):
        if self.name in self.journal.refuse:
            raise RefusedError("busy")
        copy = type(data)()
        copy.CopyFrom(data)
        self.journal.received.setdefault(self.name, []).append(copy)
        if self.next_consumer is not None:
            self.next_consumer.consume(data)

    def shutdown(self):
        self.journal.note("shutdown", self.name)


def factories(journal: Journal) -> dict[str, dict[str, Factory]]:
    class RecorderFactory(Factory):
        type = "recorder"
        config_model = RecorderConfig

        def create(self, settings, config, next_consumer):
            return Recorder(journal, str(settings.id), next_consumer)

    class TaggerFactory(Factory):
        type = "tagger"
        config_model = TaggerConfig
        mutates_data = True

        def create(self, settings, config, next_consumer):
            return Tagger(journal, f"{settings.id}", config, next_consumer)

    class PasserFactory(Factory):
        """A processor that passes data on untouched (and says it does not edit it)."""

        type = "passer"

        def create(self, settings, config, next_consumer):
            class Passer(Component):
                def consume(self, data):
                    next_consumer.consume(data)

            return Passer()

    class KeeperFactory(Factory):
        type = "keeper"

        def create(self, settings, config, next_consumer):
            return Keeper(journal, str(settings.id))

    class ProfilesOnlyFactory(KeeperFactory):
        type = "profiles_only"
        signals = frozenset({"profiles"})

    class ForwardLikeFactory(Factory):
        type = "forward_like"

        def create(self, settings, config, next_consumer):
            return Keeper(journal, str(settings.id), next_consumer)

    class NoopExtensionFactory(Factory):
        type = "noop"

        def create(self, settings, config, next_consumer):
            return Keeper(journal, f"ext:{settings.id}")

    return {
        "receivers": {"recorder": RecorderFactory()},
        "processors": {"tagger": TaggerFactory(), "passer": PasserFactory()},
        "exporters": {"keeper": KeeperFactory(), "profiles_only": ProfilesOnlyFactory()},
        "connectors": {"forward_like": ForwardLikeFactory()},
        "extensions": {"noop": NoopExtensionFactory()},
    }


def one_profile(samples: int = 2):
    builder = ProfilesBuilder()
    stack = builder.stack([builder.location(lines=[(builder.function("work"), 1, 0)])])
    profile = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 1})))
    for _ in range(samples):
        builder.sample(profile, stack, [1])
    return builder.data
