from pycollector.component import Factory

from receivers.otlp.config import OtlpReceiverConfig


class OtlpReceiverFactory(Factory):
    type = "otlp"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = OtlpReceiverConfig

    def create(self, settings, config, next_consumer):
        # Imported here so that validating a config does not load gRPC's server machinery.
        from receivers.otlp.receiver import OtlpReceiver

        return OtlpReceiver(settings, config, next_consumer, self.signals)


factory = OtlpReceiverFactory()
