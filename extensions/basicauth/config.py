"""Settings of the basicauth extension, with the Go contrib extension's keys: ``htpasswd`` makes
it a server authenticator, ``client_auth`` a client one."""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig, OptionalSection, as_written
from pycollector.config.servers import WithOptionalSections
from pycollector.config.types import OpaqueString


class HtpasswdSettings(ComponentConfig):
    # An htpasswd file (bcrypt, APR1/MD5, SHA-256/512-crypt, {SHA}, plain text), and/or lines of
    # the same given here; a user in both is the inline one.
    file: str = ""
    inline: str = ""


class ClientAuthSettings(ComponentConfig):
    username: str = ""
    password: OpaqueString | None = None
    # Files holding them, read again when they change; each takes the place of its inline key.
    username_file: str = ""
    password_file: str = ""


class BasicAuthConfig(WithOptionalSections):
    optional_sections = frozenset({"htpasswd", "client_auth"})
    htpasswd: OptionalSection[HtpasswdSettings] = None
    client_auth: OptionalSection[ClientAuthSettings] = None

    @pydantic.model_validator(mode="after")
    def _one_side(self, info: pydantic.ValidationInfo) -> "BasicAuthConfig":
        if not as_written(info):
            return self  # (the default, which print-config shows, has neither)
        if self.htpasswd is not None and self.client_auth is not None:
            raise ValueError("only one of `htpasswd` or `client_auth` can be specified")
        if self.client_auth is None and (self.htpasswd is None or not (self.htpasswd.file or self.htpasswd.inline)):
            raise ValueError("no credential source provided")
        if self.client_auth is not None and ":" in self.client_auth.username:
            raise ValueError("client_auth::username: invalid authorization format (a user name cannot hold ':')")
        return self
