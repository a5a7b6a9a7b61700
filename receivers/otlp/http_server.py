"""OTLP/HTTP: POST a protobuf or JSON body to a signal's path; the answer is encoded like the request.

Built on the standard library's ThreadingHTTPServer rather than a web framework: OTLP/HTTP is
four POST routes, the pipeline blocks (a thread per connection fits, as everywhere in the engine),
and every status code and header the spec asks for is written here by hand, with no dependency
to install on every node that runs an agent.

Answers, in the order the Go receiver checks: with ``auth``, credentials missing or wrong 401
(Go runs its authenticator before the routes; a CORS preflight is answered before it); unknown
path 404; not POST 405; Content-Type
neither protobuf nor JSON 415; a body over max_request_body_size 413; a body that cannot be read,
decompressed or decoded 400; then what the pipeline said (503 with Retry-After when it refused).
Errors after the encoding is known carry a google.rpc.Status in that encoding.
"""

from __future__ import annotations

import math
import os
import socket
import ssl
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable
from urllib.parse import parse_qs, urlsplit

import grpc

from pycollector.auth import Unauthenticated
from pycollector.client import ClientInfo, metadata_from_pairs
from pycollector.component import StartError
from pycollector.http_server import ServingThread, server_tls_context, split_endpoint
from pycollector.otlp import ENCODINGS, OTLP_SIGNALS, Encoding, encoding_of

from receivers.otlp.auth_gate import AuthGate
from receivers.otlp.config import HttpServerSettings
from receivers.otlp.decoding import RequestDecoder
from receivers.otlp.delivery import Rejection, undecodable
from receivers.otlp.http_body import BodyError, read_body

# A refusal that names no delay still tells the client when to come back.
DEFAULT_RETRY_AFTER_SECONDS = 1


class OtlpHttpServer:
    def __init__(self, settings: HttpServerSettings, signals: Iterable[str], decoder: RequestDecoder, deliver: Callable[..., Rejection | None],
                 shared_port: bool = False):
        self.settings = settings
        self.shared_port = shared_port
        self.decoder = decoder
        paths = settings.url_paths()
        self.routes = {paths[signal]: OTLP_SIGNALS[signal] for signal in signals}
        self._deliver = deliver
        self._server: _Server | None = None
        self._serving: ServingThread | None = None
        self.gate: AuthGate | None = None  # who may send (auth), set before start

    def start(self) -> tuple[str, int]:
        """Listen and serve; returns the bound (host, port), port 0 in the config being resolved
        (a unix socket: (its path, 0))."""
        unix_path = self.settings.unix_path()
        if unix_path is not None:
            address, family = unix_path, socket.AF_UNIX
            _remove_stale_socket(unix_path)
        else:
            host, port = split_endpoint(self.settings.endpoint)
            address, family = (host, port), socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            server = _Server(address, family, self, reuse_port=self.shared_port)
        except OSError as error:
            raise StartError(f"protocols::http::endpoint: cannot listen on {self.settings.endpoint}: {error.strerror or error}") from error
        if self.settings.tls:
            server.use_tls(self._tls_context())
        self._server = server
        self._serving = ServingThread(server, "otlp-http")
        return (unix_path, 0) if unix_path is not None else (address[0], server.server_address[1])

    def stop(self, grace: float) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace`` seconds."""
        if self._server is None:
            return
        self._serving.stop()
        self._server.server_close()
        self._server.close_connections(grace)
        self._server = self._serving = None

    def _tls_context(self) -> ssl.SSLContext:
        return server_tls_context(self.settings.tls, "protocols::http::tls")

    # -- one request -------------------------------------------------------------------------------

    def handle(self, request: "_Handler") -> None:
        request.cors_headers = {}  # (a kept-alive connection's handler serves several requests)
        if self.settings.cors is not None and self._cors(request):
            return
        auth = {}
        if self.gate is not None:
            try:
                auth = self.gate.admit(self._headers_for_auth(request), self._address(request))
            except Unauthenticated as refusal:
                encoding = encoding_of(request.headers.get("Content-Type")) or ENCODINGS["json"]
                status = Rejection(grpc.StatusCode.UNAUTHENTICATED, 401, str(refusal)).status()
                return request.reply(401, encoding.content_type, encoding.encode(status), close=True)  # (its body unread)
        otlp = self.routes.get(urlsplit(request.path).path)
        if otlp is None:
            return request.reply(404, "text/plain", b"404 page not found", close=True)
        if request.command != "POST":
            return request.reply(405, "text/plain", b"405 method not allowed, supported: [POST]", close=True, extra={"Allow": "POST"})
        encoding = encoding_of(request.headers.get("Content-Type"))
        if encoding is None:
            message = b"415 unsupported media type, supported: [application/json, application/x-protobuf]"
            return request.reply(415, "text/plain", message, close=True)
        try:
            body = read_body(request.rfile, request.headers, self.settings.max_request_body_size, self.settings.compression_algorithms)
        except BodyError as error:
            # The body may be partly unread: this connection cannot carry another request.
            return self._reject(request, encoding, Rejection(_code_for(error.status), error.status, str(error)), close=True)
        try:
            data = self.decoder.decode(otlp, body, encoding)
        except ValueError as error:
            return self._reject(request, encoding, undecodable(otlp.signal, error))
        rejection = self._deliver(data, self._client(request, auth))
        if rejection is not None:
            return self._reject(request, encoding, rejection)
        request.reply(200, encoding.content_type, encoding.encode(otlp.response_type()))

    def _cors(self, request: "_Handler") -> bool:
        """CORS as Go's confighttp: an allowed origin's requests get its Access-Control headers, and
        its preflight (OPTIONS with Access-Control-Request-Method) is answered here; True when
        the request has been answered."""
        cors, origin = self.settings.cors, request.headers.get("Origin")
        if not origin or not cors.origin_allowed(origin):
            return False
        request.cors_headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if cors.exposed_headers:
            request.cors_headers["Access-Control-Expose-Headers"] = ", ".join(cors.exposed_headers)
        if request.command != "OPTIONS" or not request.headers.get("Access-Control-Request-Method"):
            return False
        allowed = {"Access-Control-Allow-Methods": "POST", "Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        asked = request.headers.get("Access-Control-Request-Headers", "")
        if asked:
            wanted = [name.strip() for name in asked.split(",") if name.strip()]
            permitted = {name.lower() for name in cors.allowed_headers} | {"content-type", "content-encoding", "accept", "x-requested-with"}
            if "*" not in cors.allowed_headers and any(name.lower() not in permitted for name in wanted):
                request.cors_headers = {}  # (a header it may not send: the browser is told nothing)
                request.reply(204, "text/plain", b"", extra={"Vary": "Origin"})
                return True
            allowed["Access-Control-Allow-Headers"] = ", ".join(wanted)
        if cors.max_age:
            allowed["Access-Control-Max-Age"] = str(cors.max_age)
        request.cors_headers = {}
        request.reply(204, "text/plain", b"", extra=allowed)
        return True

    def _client(self, request: "_Handler", auth: dict[str, str]) -> ClientInfo:
        metadata = metadata_from_pairs(request.headers.items()) if self.settings.include_metadata else {}
        return ClientInfo(self._address(request), metadata, auth)

    @staticmethod
    def _address(request: "_Handler") -> str:
        return request.client_address[0] if request.client_address else ""

    def _headers_for_auth(self, request: "_Handler") -> dict[str, tuple[str, ...]]:
        """The request's headers, and the query parameters ``auth::request_params`` names, as if
        they were headers (as Go's confighttp hands them to the authenticator)."""
        headers = metadata_from_pairs(request.headers.items())
        if self.settings.auth.request_params:
            query = parse_qs(urlsplit(request.path).query)
            for name in self.settings.auth.request_params:
                if name in query:
                    headers[name.lower()] = tuple(query[name])
        return headers

    def _reject(self, request: "_Handler", encoding: Encoding, rejection: Rejection, close: bool = False) -> None:
        extra = {}
        if rejection.http_status == 503:
            seconds = rejection.retry_after if rejection.retry_after is not None else DEFAULT_RETRY_AFTER_SECONDS
            extra["Retry-After"] = str(max(1, math.ceil(seconds)))
        request.reply(rejection.http_status, encoding.content_type, encoding.encode(rejection.status()), close=close, extra=extra)


def _remove_stale_socket(path: str) -> None:
    """A socket file left by a previous run is removed (as Go's listener does); anything else at
    that path is left alone, and the bind then fails naming it."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def _code_for(http_status: int) -> grpc.StatusCode:
    return grpc.StatusCode.RESOURCE_EXHAUSTED if http_status == 413 else grpc.StatusCode.INVALID_ARGUMENT


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters send many requests on one connection
    server: "_Server"
    cors_headers: dict[str, str] = {}

    def setup(self) -> None:
        settings = self.server.otlp.settings
        # idle_timeout: a connection waiting this long for its next request is closed.
        self.timeout = settings.idle_timeout or None
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, on this connection's thread, not the accepting one
        super().setup()
        if not isinstance(self.client_address, tuple):  # (a unix socket's peer has no address)
            self.client_address = ("", 0)

    def _dispatch(self) -> None:
        self.server.otlp.handle(self)

    do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    def reply(self, status: int, content_type: str, body: bytes, close: bool = False, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        settings = self.server.otlp.settings
        for name, value in {**{name: value.reveal() for name, value in settings.response_headers.items()}, **self.cors_headers, **(extra or {})}.items():
            self.send_header(name, value)
        if close or not settings.keep_alives_enabled:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # the engine counts requests; a log line per request would flood the log


class _Server(ThreadingHTTPServer):
    """Knows its open connections, so a stop can end idle keep-alive ones and wait for busy ones."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int] | str, family: int, otlp: OtlpHttpServer, reuse_port: bool = False):
        self.address_family = family
        self.allow_reuse_port = reuse_port  # (the collector's workers share the port: SO_REUSEPORT)
        self.otlp = otlp
        self._connections: set[socket.socket] = set()
        self._changed = threading.Condition()
        super().__init__(address, _Handler)

    def use_tls(self, context: ssl.SSLContext) -> None:
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request(self, request, client_address) -> None:
        with self._changed:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._changed:
            self._connections.discard(request)
            self._changed.notify_all()
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away or failed its TLS handshake; others are unaffected

    def close_connections(self, grace: float) -> None:
        """End reading on every connection: idle ones close, busy ones still send their answer."""
        deadline = time.monotonic() + grace
        with self._changed:
            for connection in self._connections:
                try:
                    # socket.socket's own shutdown: an SSLSocket's would drop its TLS state mid-answer.
                    socket.socket.shutdown(connection, socket.SHUT_RD)
                except OSError:
                    pass  # already closed by the client
            while self._connections and (remaining := deadline - time.monotonic()) > 0:
                self._changed.wait(remaining)
