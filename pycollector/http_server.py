"""A small HTTP server on its own thread, for components that answer GET requests on a local
endpoint (health_check, the flame graph, pprof).

The standard library's ThreadingHTTPServer is enough: these endpoints answer a handful of GETs,
and no web framework has to be installed on every node that runs an agent. A component gives a
function from the URL path to ``Response``; this module owns the socket, the thread and stopping.
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import tempfile
import socket
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Callable
from urllib.parse import parse_qs, urlsplit

import pydantic

from pycollector.component import StartError



def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:13133``; ``:13133`` for every interface) -> (host, port)."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port, e.g. 'localhost:13133' (got {endpoint!r})")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _check_endpoint(value: str) -> str:
    split_endpoint(value)
    return value


# A config field holding ``host:port``, checked when the config is validated.
Endpoint = Annotated[str, pydantic.AfterValidator(_check_endpoint)]


def load_certificate(context: ssl.SSLContext, tls) -> None:
    """The server's certificate and key, from their files or inline PEM (written for the TLS
    library, which reads only files, to a private directory that is gone at once)."""
    if tls.cert_file and tls.key_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        return
    with tempfile.TemporaryDirectory(prefix="pycollector-tls-") as directory:
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        for path, content in ((cert, tls.certificate()), (key, tls.key())):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as stream:
                stream.write(content)
        context.load_cert_chain(cert, key)


def server_tls_context(tls, where: str) -> ssl.SSLContext:
    """A listening endpoint's TLS (``ServerTLSSettings``); StartError naming ``where`` if its files fail."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        load_certificate(context, tls)
        if tls.client_ca_file:
            context.load_verify_locations(tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as error:
        raise StartError(f"{where}: {error}") from error
    return context


@dataclasses.dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


# URL path -> what to answer; with ``query=True``, (URL path, query parameters) -> what to answer,
# each parameter's first value by name, as Go's ``r.FormValue`` reads them.
Handler = Callable[..., Response]


class HttpEndpoint:
    """Serves ``handle`` for GET and HEAD on ``endpoint`` from ``start`` until ``stop``."""

    def __init__(self, endpoint: str, handle: Handler, thread_name: str, query: bool = False,
                 tls: ssl.SSLContext | None = None, keep_alive: bool = False):
        self.endpoint = endpoint
        self._handle = handle
        self._query = query
        self._tls = tls
        self._keep_alive = keep_alive
        self._thread_name = thread_name
        self._server: ThreadingHTTPServer | None = None
        self._thread: ServingThread | None = None

    def start(self) -> str:
        """Listen and serve; returns the URL, with the bound port when the config said port 0."""
        host, port = split_endpoint(self.endpoint)
        handler = _handler_class(self._handle, self._query, self._keep_alive)
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        try:
            server = server_class((host, port), handler)
        except OSError as error:
            raise StartError(f"endpoint: cannot listen on {self.endpoint}: {error.strerror or error}") from error
        server.daemon_threads = True  # a slow client must not hold up shutdown
        server.handle_error = lambda request, address: None  # (a client gone, or a failed TLS handshake: others are unaffected)
        if self._tls is not None:
            server.socket = self._tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = ServingThread(server, self._thread_name)
        shown_host = f"[{host}]" if ":" in host else (host or "0.0.0.0")
        return f"{'https' if self._tls else 'http'}://{shown_host}:{server.server_address[1]}"

    def stop(self) -> None:
        """Stop serving; safe before ``start`` and safe twice."""
        if self._server is None:
            return
        self._thread.stop()
        self._server.server_close()
        self._server = self._thread = None


class ServingThread:
    """A socketserver server's ``serve_forever`` without its timer, on a thread of its own from
    construction to ``stop``. serve_forever looks for a stop every poll interval: 20 wake-ups a
    second at 50 ms, 1 ms of CPU a second on a crowded host, for an endpoint asked a few times a
    minute. This waits for a connection or the stop alone, and takes each connection as
    serve_forever does, through the server's documented steps."""

    def __init__(self, server: socketserver.BaseServer, name: str) -> None:
        self._server = server
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take no more connections (those taken go on, on their own threads); safe twice."""
        if self._wake_fd is None:
            return
        os.eventfd_write(self._wake_fd, 1)
        self._thread.join()
        os.close(self._wake_fd)
        self._wake_fd = None

    def _serve(self) -> None:
        server = self._server
        with selectors.DefaultSelector() as selector:
            selector.register(server.socket, selectors.EVENT_READ)
            selector.register(self._wake_fd, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fileobj == self._wake_fd for key, _ in ready):
                    return
                try:
                    request, address = server.get_request()
                except OSError:  # (the client gave up before it was taken)
                    continue
                if not server.verify_request(request, address):
                    server.shutdown_request(request)
                    continue
                try:
                    server.process_request(request, address)
                except Exception:
                    server.handle_error(request, address)
                    server.shutdown_request(request)


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _handler_class(handle: Handler, query: bool, keep_alive: bool) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        # HTTP/1.0 closes the connection after each answer; 1.1 keeps it for the next request.
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def setup(self) -> None:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()  # here, on this connection's thread, not the accepting one
            super().setup()

        def do_GET(self) -> None:
            self._answer(include_body=True)

        def do_HEAD(self) -> None:
            self._answer(include_body=False)

        def _answer(self, include_body: bool) -> None:
            url = urlsplit(self.path)
            if query:
                parameters = {name: values[0] for name, values in parse_qs(url.query, keep_blank_values=True).items()}
                response = handle(url.path, parameters)
            else:
                response = handle(url.path)
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if include_body:
                self.wfile.write(response.body)

        def log_message(self, format: str, *args) -> None:
            pass  # a request log on the collector's console would drown what it is there to show

    return _Handler
