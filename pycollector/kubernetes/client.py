"""List and watch one kind of Kubernetes object over plain HTTP.

Why plain HTTP with `requests` rather than the official `kubernetes` client: we need two GETs (a
paged list, and a watch that streams one JSON event per line) on at most four collections, with a
bearer token, a CA file or a client certificate, all of which `requests` (already a dependency)
does directly. The official client would add a large dependency tree (google-auth, websocket-client,
oauthlib, python-dateutil...) for thousands of generated API classes we would not use, and its
`watch.Watch` helper still leaves resuming, relisting on 410 Gone and bookmarks to the caller,
which is most of the work here. Owning the socket also lets shutdown interrupt a watch at once.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Iterator

import requests

from pycollector.kubernetes.access import ApiAccess

LIST_PAGE_SIZE = 500
# The server ends each watch after this long (client-go asks for 5-10 minutes); we then resume
# from the last resourceVersion, which also catches a silently dead connection.
WATCH_TIMEOUT_SECONDS = 300
CONNECT_TIMEOUT = 5.0  # seconds
LIST_READ_TIMEOUT = 60.0
WATCH_READ_TIMEOUT = WATCH_TIMEOUT_SECONDS + 30.0
GONE = 410


class ApiError(Exception):
    """The API server answered with an error (a Status object, or an HTTP error)."""

    def __init__(self, code: int, message: str):
        super().__init__(f"HTTP {code}: {message}" if code else message)
        self.code = code


class GoneError(ApiError):
    """410 Gone: the resourceVersion we resume from is too old; list everything again."""


class ApiClient:
    """One connection's worth of API access, used by one watcher thread."""

    def __init__(self, access: ApiAccess):
        self.access = access
        self._session = requests.Session()
        # The API server is reached directly, never through the host's proxy settings (Go clears
        # the proxy too), and only with the TLS settings auth_type chose.
        self._session.trust_env = False
        self._session.verify = access.verify
        self._session.cert = access.client_cert
        self._open: requests.Response | None = None
        self._interrupted = False
        self._lock = threading.Lock()

    def list(self, path: str, params: dict[str, str]) -> tuple[list[dict], str]:
        """Every object of the collection, following pages; and the list's resourceVersion."""
        items: list[dict] = []
        page = {**params, "limit": str(LIST_PAGE_SIZE)}
        while True:
            response = self._get(path, page, stream=False, read_timeout=LIST_READ_TIMEOUT)
            body = _json(response)
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            if not metadata.get("continue"):
                return items, str(metadata.get("resourceVersion", ""))
            page = {**page, "continue": metadata["continue"]}

    def watch(self, path: str, params: dict[str, str], resource_version: str) -> Iterator[dict]:
        """The events after ``resource_version``, as the server sends them, until it ends the watch."""
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS),
        }
        response = self._get(path, query, stream=True, read_timeout=WATCH_READ_TIMEOUT)
        with self._lock:
            if self._interrupted:  # interrupt() came while the request was on its way
                response.close()
                return
            self._open = response
        try:
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)
        finally:
            with self._lock:
                self._open = None
            response.close()

    def interrupt(self) -> None:
        """End the watch (open, or about to open) from another thread: shutdown must not wait for it."""
        with self._lock:
            self._interrupted = True
            response = self._open
        connection = getattr(response.raw, "connection", None) if response is not None else None
        sock = getattr(connection, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def close(self) -> None:
        self._session.close()

    def _get(self, path: str, params: dict[str, str], stream: bool, read_timeout: float) -> requests.Response:
        response = self._session.get(
            self.access.server + path,
            params=params,
            headers={"Accept": "application/json", **self.access.headers()},
            stream=stream,
            timeout=(CONNECT_TIMEOUT, read_timeout),
        )
        if response.status_code != 200:
            error = _status_error(response.status_code, _status_message(response))
            response.close()
            raise error
        return response


def raise_for_error_event(event: dict[str, Any]) -> None:
    """A watch stream reports a failure as an ERROR event carrying a Status object."""
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise _status_error(int(status.get("code") or 0), status.get("message") or status.get("reason") or "watch error")


def _status_error(code: int, message: str) -> ApiError:
    return GoneError(code, message) if code == GONE else ApiError(code, message)


def _status_message(response: requests.Response) -> str:
    try:
        status = response.json()
    except ValueError:
        return response.reason or response.text[:200]
    return status.get("message") or status.get("reason") or response.reason


def _json(response: requests.Response) -> dict:
    try:
        return response.json()
    except ValueError as error:
        raise ApiError(response.status_code, f"not a JSON response: {error}") from None
