from pycollector.component import Factory

from extensions.pprof.config import PprofExtensionConfig


class PprofExtensionFactory(Factory):
    type = "pprof"
    config_model = PprofExtensionConfig

    def create(self, settings, config, next_consumer):
        from extensions.pprof.extension import PprofExtension

        return PprofExtension(settings, config)


factory = PprofExtensionFactory()
