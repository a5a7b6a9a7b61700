from pycollector.component import Factory

from extensions.basicauth.config import BasicAuthConfig


class BasicAuthFactory(Factory):
    type = "basicauth"
    config_model = BasicAuthConfig

    def create(self, settings, config, next_consumer):
        from extensions.basicauth.extension import BasicAuth

        return BasicAuth(settings, config)


factory = BasicAuthFactory()
