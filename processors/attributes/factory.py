from pycollector.component import Factory

from processors.attributes.config import AttributesConfig


class AttributesProcessorFactory(Factory):
    type = "attributes"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = AttributesConfig
    mutates_data = True  # edits item attributes (and a profile's dictionary) in place

    def create(self, settings, config, next_consumer):
        from processors.attributes.processor import AttributesProcessor

        return AttributesProcessor(settings, config, next_consumer)


factory = AttributesProcessorFactory()
