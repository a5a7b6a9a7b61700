from pycollector.component import FIRST_WORKER, Factory

from extensions.pprof.config import PprofExtensionConfig


class PprofExtensionFactory(Factory):
    type = "pprof"
    # With several workers, worker 0's process is the one profiled (the others run the same code).
    placement = FIRST_WORKER
    config_model = PprofExtensionConfig

    def create(self, settings, config, next_consumer):
        from extensions.pprof.extension import PprofExtension

        return PprofExtension(settings, config)


factory = PprofExtensionFactory()
