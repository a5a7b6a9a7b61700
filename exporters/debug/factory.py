from pycollector.component import Factory

from exporters.debug.config import DebugConfig


class DebugExporterFactory(Factory):
    type = "debug"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = DebugConfig

    def create(self, settings, config, next_consumer):
        from exporters.debug.exporter import DebugExporter

        return DebugExporter(settings, config)


factory = DebugExporterFactory()
