"""Authenticators: extensions a server asks whether a request may come in, and a client asks what
credentials to send with one (the Go collector's extensionauth), named by a component's
``auth: {authenticator: <extension id>}`` section.

A server hands ``authenticate`` the request's headers (gRPC metadata or HTTP headers), keys lower
case, each with its values (pycollector.client.metadata_from_pairs); the authenticator raises ``Unauthenticated`` with a message safe to
send back and to log (never a credential), which the server answers with UNAUTHENTICATED (gRPC) or
401 (HTTP). A client asks ``credentials()`` for the headers to add to each request, so credentials
read from a file that changes apply to the next request.

The extension is looked up when the component starts, as Go does: a config naming one that is not
there validates, and the component then refuses to start naming it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from pycollector.component import ComponentConfig, ComponentID, StartError


class Unauthenticated(Exception):
    """The request's credentials are missing or wrong; the message says which, never what they were."""


class ServerAuthenticator:
    """An extension that decides whether a request comes in."""

    def authenticate(self, headers: Mapping[str, Sequence[str]]) -> dict[str, str]:
        """The request's auth attributes (``username``...) when its credentials are good; raises
        Unauthenticated otherwise. ``headers``: lower-case names, each with its values."""
        raise NotImplementedError


class ClientAuthenticator:
    """An extension that gives a client the credentials to send."""

    def credentials(self) -> dict[str, str]:
        """The headers (gRPC metadata) to add to the next request."""
        raise NotImplementedError


class AuthSettings(ComponentConfig):
    """``auth``: the extension that authenticates (``bearertokenauth``, ``basicauth/server``...).
    Left out, the section validates (as in Go) and the component does not start."""

    authenticator: str = ""

    @pydantic.field_validator("authenticator")
    @classmethod
    def _an_extension_id(cls, value: str) -> str:
        return str(ComponentID.checked(value))


class HttpServerAuthSettings(AuthSettings):
    # Query parameters handed to the authenticator as if they were headers (Go's request_params).
    request_params: list[str] = []


def authenticator(host: Any, settings: AuthSettings | None, kind: type, where: str) -> Any:
    """The extension ``settings`` names, of ``kind`` (ServerAuthenticator or ClientAuthenticator),
    or None with no ``auth``; StartError naming ``where`` (``receivers::otlp::protocols::grpc``)
    when the host has none of that id or it is of another kind."""
    if settings is None:
        return None
    extension = host.get_extension(settings.authenticator) if host is not None and settings.authenticator else None
    if extension is None:
        raise StartError(f'{where}::auth: failed to resolve authenticator "{settings.authenticator}": authenticator not found '
                         "(is it configured under extensions and listed in service::extensions?)")
    if not isinstance(extension, kind):
        side = "server" if kind is ServerAuthenticator else "client"
        raise StartError(f"{where}::auth: requested authenticator is not a {side} authenticator: {settings.authenticator}")
    return extension


class CredentialsFile:
    """A file holding credentials (a token, tokens one a line, a password), read when the
    extension starts and again when it changes: looked at (stat) at most once every CHECK_S when
    its value is asked for, so a rotated Kubernetes secret (a symlink swapped) or a rewritten file
    applies to the requests after it. A read that fails, or finds the file empty, keeps the last
    value and logs a warning (never the value)."""

    CHECK_S = 1.0

    def __init__(self, path: str, logger: Any, clock=time.monotonic) -> None:
        self.path = path
        self.log = logger
        self._clock = clock
        self._lock = threading.Lock()
        self._value = ""
        self._signature: tuple[int, int, int] | None = None
        self._checked_at = float("-inf")
        self.reloads = 0

    def load(self) -> None:
        """The first read; StartError when the file cannot be read or is empty."""
        try:
            self._read()
        except (OSError, ValueError) as error:
            raise StartError(f'failed to read credentials file "{self.path}": {getattr(error, "strerror", None) or error}') from None
        self._checked_at = self._clock()

    def value(self) -> str:
        """The file's content, trimmed of white space at both ends (re-read if it changed)."""
        with self._lock:
            now = self._clock()
            if now - self._checked_at >= self.CHECK_S:
                self._checked_at = now
                try:
                    if _signature(self.path) != self._signature:
                        self._read()
                        self.reloads += 1
                        self.log.info("credentials file changed: read again", file=self.path)
                except (OSError, ValueError) as error:
                    self.log.warning("failed to reload credentials file, keeping last value", file=self.path,
                                     error=getattr(error, "strerror", None) or str(error))
            return self._value

    def _read(self) -> None:
        signature = _signature(self.path)
        with open(self.path, encoding="utf-8") as stream:
            value = stream.read(MAX_CREDENTIALS_BYTES + 1).strip()
        if len(value) > MAX_CREDENTIALS_BYTES:
            raise ValueError(f"over {MAX_CREDENTIALS_BYTES} bytes")
        if not value:
            raise ValueError(f'credentials file "{self.path}" is empty')
        self._value, self._signature = value, signature


MAX_CREDENTIALS_BYTES = 1 << 20


def _signature(path: str) -> tuple[int, int, int]:
    status = os.stat(path)
    return status.st_ino, status.st_size, status.st_mtime_ns
