from pycollector.component import Factory
from pycollector.http_server import split_endpoint

from receivers.otlp.config import OtlpReceiverConfig


class OtlpReceiverFactory(Factory):
    type = "otlp"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = OtlpReceiverConfig

    def why_not_in_workers(self, config):
        """Workers share a TCP port (SO_REUSEPORT); a unix socket's path, or port 0 (a port of each
        worker's own), cannot be shared."""
        for name in ("grpc", "http"):
            server = getattr(config.protocols, name)
            if server is None:
                continue
            if server.unix_path() is not None:
                return f"protocols::{name}: a unix socket cannot be shared by several processes"
            if split_endpoint(server.endpoint)[1] == 0:
                return f"protocols::{name}::endpoint: port 0 would give each worker a port of its own"
        return None

    def create(self, settings, config, next_consumer):
        # Imported here so that validating a config does not load gRPC's server machinery.
        from receivers.otlp.receiver import OtlpReceiver

        return OtlpReceiver(settings, config, next_consumer, self.signals)


factory = OtlpReceiverFactory()
