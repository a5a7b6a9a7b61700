from pycollector.component import Factory

from processors.resourcedetection.config import ResourceDetectionConfig


class ResourceDetectionProcessorFactory(Factory):
    type = "resource_detection"
    aliases = ("resourcedetection",)  # the name Go used before contrib v0.156
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = ResourceDetectionConfig
    mutates_data = True  # adds resource attributes in place

    def create(self, settings, config, next_consumer):
        from processors.resourcedetection.processor import ResourceDetectionProcessor

        return ResourceDetectionProcessor(settings, config, next_consumer)


factory = ResourceDetectionProcessorFactory()
