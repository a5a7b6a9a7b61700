"""bearertokenauth: a server accepts a request whose header (``Authorization``) is the scheme and
one of the tokens ("Bearer <token>"); a client sends the first. Tokens are compared in constant
time, and no token is ever logged or sent back."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from pycollector.auth import ClientAuthenticator, CredentialsFile, ServerAuthenticator, Unauthenticated
from pycollector.component import Component, Settings

from extensions.bearertokenauth.config import BearerTokenAuthConfig


class BearerTokenAuth(Component, ServerAuthenticator, ClientAuthenticator):
    def __init__(self, settings: Settings, config: BearerTokenAuthConfig) -> None:
        self.log = settings.logger
        self.config = config
        self._file = CredentialsFile(config.filename, settings.logger) if config.filename and not config.tokens else None
        if self._file is not None and config.token:
            self.log.warning("a filename is specified: the token in the config is not used", filename=config.filename)

    def start(self, host) -> None:
        if self._file is not None:
            self._file.load()

    def _tokens(self) -> list[str]:
        if self._file is not None:
            return [line.strip() for line in self._file.value().split("\n")]
        if self.config.tokens:
            return [token.reveal() for token in self.config.tokens]
        return [self.config.token.reveal()]

    def _expected(self) -> list[str]:
        scheme = self.config.scheme
        return [f"{scheme} {token}" if scheme else token for token in self._tokens()]

    def authenticate(self, headers: Mapping[str, Sequence[str]]) -> dict[str, str]:
        values = headers.get(self.config.header.lower())
        if not values or not values[0]:
            raise Unauthenticated(f"missing or empty authorization header: {self.config.header}")
        given = values[0].encode()
        # Every token compared, whichever matches: the time taken says nothing of which.
        matched = [hmac.compare_digest(given, expected.encode()) for expected in self._expected()]
        if not any(matched):
            raise Unauthenticated("provided authorization does not match expected scheme or token")
        return {}

    def credentials(self) -> dict[str, str]:
        return {self.config.header: self._expected()[0]}
