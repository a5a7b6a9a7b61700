"""The otlp_http exporter: one POST per queued message, on a pooled requests session.

As the Go exporter: 429, 502, 503 and 504 are retried, waiting at least what Retry-After says;
any other status drops the data. A request that never got an answer (connection refused, reset,
timed out) is retried.
"""

from __future__ import annotations

import gzip
import http.cookiejar
import os
import tempfile
import zlib
from typing import Any

import requests
import zstandard
from google.protobuf.message import Message
from google.rpc import status_pb2
from requests.adapters import HTTPAdapter

from pycollector.component import PermanentError, Settings
from pycollector.config.types import reveal_headers
from pycollector.exporterhelper import RetryableSendError
from pycollector.otlp import ENCODINGS, OTLP_SIGNALS, encoding_of, profiles_wire
from pycollector.exporterhelper.otlp_exporter import OtlpExporter

from exporters.otlp_http.config import OtlpHttpConfig
from exporters.otlp_http.retry_after import parse_retry_after

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
# Go's levels: 0 (and -1) is the compressor's default; gzip and deflate at zlib's (6).
ZLIB_DEFAULT_LEVEL = 6


def compressor(name: str, level: int):
    """The function that compresses a body with ``name`` at ``level``; None for no compression."""
    if name == "gzip":
        return lambda body: gzip.compress(body, compresslevel=level if level > 0 else ZLIB_DEFAULT_LEVEL)
    if name == "deflate":
        return lambda body: zlib.compress(body, level if level > 0 else ZLIB_DEFAULT_LEVEL)
    if name == "zstd":
        return zstandard.ZstdCompressor(level=level).compress if level > 0 else zstandard.compress
    return None


# How much of an error body that is not a google.rpc.Status goes into the log line.
_ERROR_TEXT_LIMIT = 200


class OtlpHttpExporter(OtlpExporter):
    config: OtlpHttpConfig

    def __init__(self, settings: Settings, config: OtlpHttpConfig):
        super().__init__(settings, config)
        self._encoding = ENCODINGS[config.encoding]
        self._compress = compressor(config.compression, config.compression_params.level)
        self._urls = {signal: config.signal_url(signal) for signal in OTLP_SIGNALS}
        self._session: requests.Session | None = None
        # Given on every request: requests lets REQUESTS_CA_BUNDLE override a session's own verify.
        self._verify = False if config.tls.insecure_skip_verify else (config.tls.ca_file or True)
        self._client_cert = (config.tls.cert_file, config.tls.key_file) if config.tls.cert_file else None
        self._pem_dir: tempfile.TemporaryDirectory | None = None  # inline PEM, written for the TLS library

    def _open(self) -> None:
        config = self.config
        files = config.tls.read_files()  # a missing file stops the start, naming its key
        if config.tls.has_inline_pem():
            self._pem_dir = tempfile.TemporaryDirectory(prefix="pycollector-tls-")
            written = {name: _private_file(self._pem_dir.name, name, content) for name, content in (("ca", files.ca), ("cert", files.cert), ("key", files.key))}
            self._verify = False if config.tls.insecure_skip_verify else (written["ca"] or True)
            self._client_cert = (written["cert"], written["key"]) if written["cert"] else None
        self._session = self._new_session()

    def _new_session(self, cookies: http.cookiejar.CookieJar | None = None) -> requests.Session:
        """A session as the config asks: its proxy, cookie policy, TLS server name, headers;
        ``cookies``: a jar to share (the exporter's, for a session of one request)."""
        config = self.config
        session = requests.Session()
        # Proxies: the configured one, never the environment's (Go reads only proxy_url too).
        session.trust_env = False
        if config.proxy_url:
            session.proxies = {"http": config.proxy_url, "https": config.proxy_url}
        if cookies is not None:
            session.cookies = cookies
        elif config.cookies is None:
            session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))  # (no jar, as Go without `cookies`)
        if config.disable_keep_alives:
            session.headers["Connection"] = "close"
        # One pooled connection per consumer thread; retries are the sending queue's job.
        adapter = _ServerNameAdapter(config.tls.server_name_override, pool_maxsize=config.sending_queue.num_consumers, max_retries=0)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers.update({"Content-Type": self._encoding.content_type, **reveal_headers(config.headers)})
        if self._compress is not None:
            session.headers["Content-Encoding"] = config.compression
        return session

    def _export(self, signal: str, data: Any) -> Message:
        url = self._urls[signal]
        if signal == "profiles":
            body = profiles_wire.encode(data, self._encoding.name, self.profiles_layout)
        else:
            body = self._encoding.encode(data)
        if self._compress is not None:
            body = self._compress(body)
        # One request a connection with disable_keep_alives, as Go's DisableKeepAlives: the
        # Connection: close header asks the server to close, but one that answers HTTP/1.1 without
        # saying so leaves the connection in the pool, and its reuse races the server's close
        # (RemoteDisconnected on a loaded host). So such a request has a session of its own (the
        # cookie jar shared), closed with it; closing the shared one could close another
        # consumer's pool under it.
        session = self._new_session(self._session.cookies) if self.config.disable_keep_alives else self._session
        try:
            credentials = self.authenticator.credentials() if self.authenticator is not None else None  # (a file's may change)
            response = session.post(url, data=body, headers=credentials, timeout=self.config.timeout or None, verify=self._verify, cert=self._client_cert)
        except requests.RequestException as error:
            raise RetryableSendError(f"no answer from {url}: {error}") from None
        finally:
            if session is not self._session:
                session.close()
        response_type = OTLP_SIGNALS[signal].response_type
        if 200 <= response.status_code < 300:
            return _decode(response, response_type) or response_type()
        message = f"{url} answered HTTP {response.status_code}: {_error_text(response)}"
        if response.status_code in RETRYABLE_STATUSES:
            raise RetryableSendError(message, retry_after=parse_retry_after(response.headers.get("Retry-After")))
        raise PermanentError(message)

    def _close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._pem_dir is not None:
            self._pem_dir.cleanup()
            self._pem_dir = None


def _private_file(directory: str, name: str, content: bytes | None) -> str | None:
    if content is None:
        return None
    path = os.path.join(directory, f"{name}.pem")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as stream:
        stream.write(content)
    return path


def _decode(response: requests.Response, message_type: type[Message]) -> Message | None:
    """The body as ``message_type`` in the encoding the server named; None if empty or unreadable."""
    encoding = encoding_of(response.headers.get("Content-Type"))
    if encoding is None or not response.content:
        return None
    try:
        return encoding.decode(response.content, message_type)
    except ValueError:
        return None


def _error_text(response: requests.Response) -> str:
    status = _decode(response, status_pb2.Status)
    if status is not None and status.message:
        return status.message
    return response.text[:_ERROR_TEXT_LIMIT] or response.reason or ""


class _ServerNameAdapter(HTTPAdapter):
    """Checks the server certificate against ``server_name_override`` instead of the URL's host."""

    def __init__(self, server_name: str, **kwargs: Any):
        self._server_name = server_name
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        if self._server_name:
            kwargs.update(server_hostname=self._server_name, assert_hostname=self._server_name)
        super().init_poolmanager(*args, **kwargs)
