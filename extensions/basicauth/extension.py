"""basicauth: a server accepts a request whose ``Authorization`` is ``Basic base64(user:password)``
for a user and password its htpasswd holds (``username`` is then the request's auth attribute); a
client sends its user and password so. The htpasswd's hashes are checked by passlib (libpass), as
Apache's htpasswd writes them: bcrypt, APR1/MD5, SHA-256/512-crypt, {SHA}, plain text. A bcrypt
check takes a quarter second of CPU at cost 12, so a header that passed is remembered
(MAX_REMEMBERED, by its SHA-256) rather than checked again at every request."""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import threading
from collections.abc import Mapping, Sequence

from pycollector.auth import ClientAuthenticator, CredentialsFile, ServerAuthenticator, Unauthenticated
from pycollector.component import Component, Settings, StartError

from extensions.basicauth.config import BasicAuthConfig

MAX_REMEMBERED = 1024


class BasicAuth(Component, ServerAuthenticator, ClientAuthenticator):
    def __init__(self, settings: Settings, config: BasicAuthConfig) -> None:
        self.log = settings.logger
        self.config = config
        self._users = None  # passlib's HtpasswdFile, once started (a server)
        self._passed: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        client = config.client_auth
        self._username_file = CredentialsFile(client.username_file, settings.logger) if client and client.username_file else None
        self._password_file = CredentialsFile(client.password_file, settings.logger) if client and client.password_file else None

    def start(self, host) -> None:
        for credentials_file in (self._username_file, self._password_file):
            if credentials_file is not None:
                credentials_file.load()
        if self.config.htpasswd is not None:
            from passlib.apache import HtpasswdFile

            settings = self.config.htpasswd
            content = ""
            if settings.file:
                try:
                    with open(settings.file, encoding="utf-8") as stream:
                        content = stream.read()
                except OSError as error:
                    raise StartError(f"open htpasswd file: {settings.file}: {error.strerror}") from None
            # (a user in both: the inline line, read last, is the one kept)
            self._users = HtpasswdFile.from_string(content + "\n" + settings.inline)

    # -- a server ---------------------------------------------------------------------------------

    def authenticate(self, headers: Mapping[str, Sequence[str]]) -> dict[str, str]:
        if self._users is None:
            raise Unauthenticated("this basicauth extension is a client's (client_auth), not a server's (htpasswd)")
        values = headers.get("authorization")
        if not values or not values[0]:
            raise Unauthenticated("no basic auth provided")
        value = values[0]
        if value[:6].lower() != "basic ":
            raise Unauthenticated("invalid authorization scheme prefix")
        key = hashlib.sha256(value.encode()).digest()
        with self._lock:
            username = self._passed.get(key)
            if username is not None:
                self._passed.move_to_end(key)
                return {"username": username}
        try:
            username, colon, password = base64.b64decode(value[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthenticated("invalid authorization format") from None
        if not colon:
            raise Unauthenticated("invalid authorization format")
        if not self._users.check_password(username, password):  # (None: no such user)
            raise Unauthenticated("invalid credentials")
        with self._lock:
            self._passed[key] = username
            while len(self._passed) > MAX_REMEMBERED:
                self._passed.popitem(last=False)
        return {"username": username}

    # -- a client ---------------------------------------------------------------------------------

    def credentials(self) -> dict[str, str]:
        client = self.config.client_auth
        username = self._username_file.value() if self._username_file is not None else client.username
        password = self._password_file.value() if self._password_file is not None else (client.password.reveal() if client.password else "")
        pair = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        return {"Authorization": f"Basic {pair}"}
