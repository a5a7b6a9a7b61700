from pycollector.component import Factory

from receivers.profiling.config import ProfilingConfig


class ProfilingReceiverFactory(Factory):
    type = "profiling"
    signals = frozenset({"profiles"})
    config_model = ProfilingConfig

    def create(self, settings, config, next_consumer):
        # Imported here so that validating a config, or running one without this receiver, never
        # loads bcc.
        from receivers.profiling.receiver import ProfilingReceiver

        return ProfilingReceiver(settings, config, next_consumer)


factory = ProfilingReceiverFactory()
