"""The forward connector: what one pipeline exports, another pipeline of the same signal receives
(e.g. fan one receiver out to pipelines with different processors)."""

from pycollector.component import Component, ComponentConfig, Factory


class ForwardConfig(ComponentConfig):
    pass


class ForwardConnector(Component):
    def __init__(self, next_consumer):
        self.next_consumer = next_consumer

    def consume(self, data) -> None:
        self.next_consumer.consume(data)


class ForwardConnectorFactory(Factory):
    type = "forward"
    config_model = ForwardConfig
    takes_serialized_profiles = True  # passes them on as they came

    def create(self, settings, config, next_consumer):
        return ForwardConnector(next_consumer)


factory = ForwardConnectorFactory()
