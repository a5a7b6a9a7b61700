from pycollector.component import Factory

from processors.k8sattributes.config import K8sAttributesConfig


class K8sAttributesProcessorFactory(Factory):
    # Renamed from k8sattributes in the Go collector v0.146.0; the old name is a deprecated alias.
    type = "k8s_attributes"
    aliases = ("k8s_attributes",)
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = K8sAttributesConfig
    mutates_data = True  # adds resource attributes in place

    def create(self, settings, config, next_consumer):
        from processors.k8sattributes.processor import K8sAttributesProcessor

        return K8sAttributesProcessor(settings, config, next_consumer)


factory = K8sAttributesProcessorFactory()
