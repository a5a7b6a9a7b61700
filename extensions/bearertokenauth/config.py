"""Settings of the bearertokenauth extension, with the Go contrib extension's keys and defaults."""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig, as_written
from pycollector.config.types import OpaqueString


class BearerTokenAuthConfig(ComponentConfig):
    # The header that carries the token (gRPC metadata: its lower-case name).
    header: str = "Authorization"
    # Before the token, with a space ("Bearer <token>"); empty: the token alone.
    scheme: str = "Bearer"
    token: OpaqueString | None = None
    # Any of these is accepted by a server; a client sends the first.
    tokens: list[OpaqueString] = []
    # A file of tokens, one a line (a server accepts each, a client sends the first), read again
    # when it changes; it takes the place of ``token``.
    filename: str = ""

    @pydantic.model_validator(mode="after")
    def _some_token(self, info: pydantic.ValidationInfo) -> "BearerTokenAuthConfig":
        if not as_written(info):
            return self  # (the default, which print-config shows, has none)
        if not self.token and not self.tokens and not self.filename:
            raise ValueError("no bearer token provided")
        if self.token and self.tokens:
            raise ValueError("either tokens or token should be provided, not both")
        return self
