from pycollector.component import Factory

from processors.resource.config import ResourceConfig


class ResourceProcessorFactory(Factory):
    type = "resource"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = ResourceConfig
    mutates_data = True  # edits resource attributes in place

    def create(self, settings, config, next_consumer):
        from processors.resource.processor import ResourceProcessor

        return ResourceProcessor(settings, config, next_consumer)


factory = ResourceProcessorFactory()
