from pycollector.component import SUPERVISOR, Factory

from extensions.health_check.config import HealthCheckConfig


class HealthCheckExtensionFactory(Factory):
    type = "health_check"
    # One answer for the collector: with several workers, the supervisor gives it from all of theirs.
    placement = SUPERVISOR
    config_model = HealthCheckConfig

    def create(self, settings, config, next_consumer):
        from extensions.health_check.extension import HealthCheckExtension

        return HealthCheckExtension(settings, config)


factory = HealthCheckExtensionFactory()
