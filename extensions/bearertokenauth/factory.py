from pycollector.component import Factory

from extensions.bearertokenauth.config import BearerTokenAuthConfig


class BearerTokenAuthFactory(Factory):
    type = "bearertokenauth"
    config_model = BearerTokenAuthConfig

    def create(self, settings, config, next_consumer):
        from extensions.bearertokenauth.extension import BearerTokenAuth

        return BearerTokenAuth(settings, config)


factory = BearerTokenAuthFactory()
