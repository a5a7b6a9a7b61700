from pycollector.component import Factory

from exporters.otlp_http.config import OtlpHttpConfig


class OtlpHttpExporterFactory(Factory):
    type = "otlp_http"
    aliases = ("otlphttp",)
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = OtlpHttpConfig
    takes_serialized_profiles = True  # sends their bytes

    def create(self, settings, config, next_consumer):
        # Imported here so that validating a config does not load requests.
        from exporters.otlp_http.exporter import OtlpHttpExporter

        return OtlpHttpExporter(settings, config)


factory = OtlpHttpExporterFactory()
