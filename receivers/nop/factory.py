"""The nop receiver, as the Go collector's: receives nothing. A pipeline needs a receiver; this
one fills the place (a pipeline fed only by a connector's other side, a config under test)."""

from pycollector.component import Component, ComponentConfig, Factory


class NopConfig(ComponentConfig):
    pass


class NopReceiverFactory(Factory):
    type = "nop"
    config_model = NopConfig

    def create(self, settings, config, next_consumer):
        return Component()


factory = NopReceiverFactory()
