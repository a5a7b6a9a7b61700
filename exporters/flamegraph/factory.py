from pycollector.component import Factory

from exporters.flamegraph.config import FlamegraphConfig


class FlamegraphExporterFactory(Factory):
    type = "flamegraph"
    signals = frozenset({"profiles"})
    config_model = FlamegraphConfig

    def create(self, settings, config, next_consumer):
        from exporters.flamegraph.exporter import FlamegraphExporter

        return FlamegraphExporter(settings, config)


factory = FlamegraphExporterFactory()
