from pycollector.component import Factory

from exporters.pprof.config import PprofConfig


class PprofExporterFactory(Factory):
    type = "pprof"
    signals = frozenset({"profiles"})
    config_model = PprofConfig

    def create(self, settings, config, next_consumer):
        from exporters.pprof.exporter import PprofExporter

        return PprofExporter(settings, config)


factory = PprofExporterFactory()
