"""The nop exporter, as the Go collector's: takes everything and sends it nowhere. What it is given
is counted as sent by the engine (otelcol_exporter_sent_*), so a pipeline under test still shows
its throughput."""

from pycollector.component import Component, ComponentConfig, Factory


class NopConfig(ComponentConfig):
    pass


class NopExporter(Component):
    def consume(self, data) -> None:
        pass


class NopExporterFactory(Factory):
    type = "nop"
    config_model = NopConfig
    takes_serialized_profiles = True  # passes them on as they came

    def create(self, settings, config, next_consumer):
        return NopExporter()


factory = NopExporterFactory()
