from pycollector.component import Factory

from exporters.otlp_grpc.config import OtlpGrpcConfig


class OtlpGrpcExporterFactory(Factory):
    type = "otlp_grpc"
    aliases = ("otlp",)
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = OtlpGrpcConfig
    takes_serialized_profiles = True  # sends their bytes

    def create(self, settings, config, next_consumer):
        # Imported here so that validating a config does not load gRPC.
        from exporters.otlp_grpc.exporter import OtlpGrpcExporter

        return OtlpGrpcExporter(settings, config)


factory = OtlpGrpcExporterFactory()
