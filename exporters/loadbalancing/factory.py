from pycollector.component import Factory

from exporters.loadbalancing.config import LoadBalancingConfig


class LoadBalancingExporterFactory(Factory):
    type = "load_balancing"  # (contrib 0.153's name; the older one still works, logged as deprecated)
    aliases = ("loadbalancing",)
    # Routed by resource: traces, routed by trace id in Go, are not offered.
    signals = frozenset({"profiles", "metrics", "logs"})
    config_model = LoadBalancingConfig

    def create(self, settings, config, next_consumer):
        from exporters.loadbalancing.exporter import LoadBalancingExporter
        from exporters.otlp_grpc.factory import factory as otlp_grpc

        return LoadBalancingExporter(settings, config, otlp_grpc)


factory = LoadBalancingExporterFactory()
