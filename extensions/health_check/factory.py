from pycollector.component import Factory

from extensions.health_check.config import HealthCheckConfig


class HealthCheckExtensionFactory(Factory):
    type = "health_check"
    config_model = HealthCheckConfig

    def create(self, settings, config, next_consumer):
        from extensions.health_check.extension import HealthCheckExtension

        return HealthCheckExtension(settings, config)


factory = HealthCheckExtensionFactory()
