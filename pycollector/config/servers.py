"""Settings of a listening endpoint, with the keys of the Go collector's confignet, configtls,
configgrpc and confighttp server configs: what a receiver or an extension that listens accepts.

Each Go key is accepted and acts, or is refused by name (``only_go_default`` where Go's default,
off or none, is what happens here anyway). See the README's components table.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

import pydantic

from pycollector.component import ComponentConfig, OptionalSection, not_supported, only_go_default, optional_section
from pycollector.config.types import NonNegativeDuration, OpaqueString, parse_duration
from pycollector.http_server import split_endpoint

# Go's confignet transports that can listen; the datagram and raw ones cannot carry OTLP, npipe is Windows'.
LISTENING_TRANSPORTS = ("tcp", "tcp4", "tcp6", "unix")
# "Go's default" of a list is no list: nil, or written empty.
_EMPTY_LIST: list = []


def _as_list(value: Any) -> Any:
    return [] if value is None else value


class WithOptionalSections(ComponentConfig):
    """A model with Go optional sections (``optional_section``): one that is off is left out of a
    dump, as a section written ``null`` would read back as on. ``optional_sections``: a model's
    own, besides OPTIONAL_SECTIONS."""

    optional_sections: ClassVar[frozenset[str]] = frozenset()

    @pydantic.model_serializer(mode="wrap")
    def _leave_out_sections_that_are_off(self, serialize: Any) -> dict[str, Any]:
        dumped = serialize(self)
        return {key: value for key, value in dumped.items()
                if value is not None or (key not in OPTIONAL_SECTIONS and key not in self.optional_sections)}


# The keys that are Go optional sections wherever they are.
OPTIONAL_SECTIONS = frozenset({"tls", "auth", "cors", "keepalive", "server_parameters", "enforcement_policy", "dialer",
                               "response_body", "check_collector_pipeline", "cookies", "batch"})


# -- TLS ------------------------------------------------------------------------------------------

_NoTlsTuning = "the TLS library's defaults are used (TLS 1.2 and up, its cipher suites and curves)"
# (declared here: a call in an annotation reads as a string to linters under `annotations`)
_NoServerCa = only_go_default("", "a server checks its clients against client_ca_file")
_ReadAtStart = only_go_default(False, "the certificates are read at start")
_ReloadInterval = only_go_default(0.0, "the certificates are read at start", parse_duration)
_DefaultTlsText = only_go_default("", _NoTlsTuning)
_DefaultTlsList = only_go_default(_EMPTY_LIST, _NoTlsTuning, _as_list)
_DefaultTlsFlag = only_go_default(False, _NoTlsTuning)
_NoSystemCaPool = only_go_default(False, "a server checks its clients against client_ca_file")
_NoTpm = not_supported("keys in a TPM")
_ListenerDialerTimeout = only_go_default(0.0, "a dialer timeout does not apply to an endpoint that listens", parse_duration)


class GoTlsTuning(ComponentConfig):
    """configtls's keys that tune the TLS library, which keeps its defaults here: accepted at
    Go's defaults, refused by name otherwise. Both a server's and a client's TLS have them."""

    min_version: _DefaultTlsText = None
    max_version: _DefaultTlsText = None
    cipher_suites: _DefaultTlsList = None
    include_insecure_cipher_suites: _DefaultTlsFlag = None
    curve_preferences: _DefaultTlsList = None
    reload_interval: _ReloadInterval = None
    tpm: _NoTpm = None


class CertificateAndKey(GoTlsTuning):
    """configtls's certificate and key, each a file or inline PEM, not both: a server's own, or a
    client's for mutual TLS."""

    cert_file: str = ""
    cert_pem: str = ""
    key_file: str = ""
    key_pem: OpaqueString | None = None

    @pydantic.model_validator(mode="after")
    def _one_form_each(self) -> "CertificateAndKey":
        for name in ("ca", "cert", "key"):  # (a server has no ca_*: getattr gives None)
            if getattr(self, f"{name}_file", None) and getattr(self, f"{name}_pem", None):
                raise ValueError(f"{name}_file and {name}_pem: give one, not both")
        return self


class ServerTLSSettings(CertificateAndKey):
    """configtls.ServerConfig: the certificate and key (files or inline PEM), and the CA clients
    must be signed by (mutual TLS)."""

    # When set, clients must present a certificate signed by one of these CAs (mutual TLS).
    client_ca_file: str = ""
    ca_file: _NoServerCa = None
    ca_pem: _NoServerCa = None
    client_ca_file_reload: _ReadAtStart = None
    include_system_ca_certs_pool: _NoSystemCaPool = None

    @pydantic.model_validator(mode="after")
    def _certificate_and_key(self) -> "ServerTLSSettings":
        # As Go: a server's TLS needs its certificate and key.
        if not (self.cert_file or self.cert_pem) or not (self.key_file or self.key_pem):
            raise ValueError("a certificate and its key are needed (cert_file or cert_pem, key_file or key_pem)")
        return self

    def certificate(self) -> bytes:
        return self.cert_pem.encode() if self.cert_pem else _read(self.cert_file)

    def key(self) -> bytes:
        return self.key_pem.reveal().encode() if self.key_pem is not None else _read(self.key_file)


def _read(path: str) -> bytes:
    with open(path, "rb") as stream:
        return stream.read()


# -- the endpoint ---------------------------------------------------------------------------------


class Dialer(ComponentConfig):
    timeout: _ListenerDialerTimeout = None


class ListenerSettings(WithOptionalSections):
    """confignet.AddrConfig for a server: where it listens. ``endpoint`` is host:port for tcp*, a
    socket's path for unix."""

    transport: Literal[LISTENING_TRANSPORTS] = "tcp"  # (before endpoint, whose check reads it)
    endpoint: str
    dialer: Dialer | None = None

    @pydantic.field_validator("transport", mode="before")
    @classmethod
    def _listening(cls, value: Any) -> Any:
        if value in ("udp", "udp4", "udp6", "ip", "ip4", "ip6", "unixgram", "unixpacket", "npipe"):
            raise ValueError(f"not supported by pycollector: transport {value!r} (tcp, tcp4, tcp6 or unix)")
        if value == "":
            raise ValueError("must not be empty (tcp, tcp4, tcp6 or unix)")
        return value

    @pydantic.field_validator("endpoint")
    @classmethod
    def _endpoint_for_its_transport(cls, endpoint: str, info: pydantic.ValidationInfo) -> str:
        if info.data.get("transport") == "unix":
            if not endpoint:
                raise ValueError("a unix socket's path is needed")
        else:
            split_endpoint(endpoint)  # (raises naming the form it expects)
        return endpoint

    def unix_path(self) -> str | None:
        return self.endpoint if self.transport == "unix" else None


# -- authentication and middlewares, which need extensions this collector does not have -----------

_NoAuthenticators = "pycollector has no authenticator extensions"
_NoMiddlewares = "pycollector has no middleware extensions"


def refused_auth(value: Any) -> Any:
    """``auth`` off (``enabled: false``) is accepted; any authenticator is refused by name."""
    value = optional_section(value)
    if value is None:
        return None
    raise ValueError(f"not supported by pycollector: {_NoAuthenticators}")


Middlewares = only_go_default(_EMPTY_LIST, _NoMiddlewares, _as_list)
# ``auth``: off (``enabled: false``) is accepted, any authenticator refused by name.
RefusedAuth = Annotated[None, pydantic.BeforeValidator(refused_auth)]


def grpc_buffer_options(read_buffer_size: int, write_buffer_size: int) -> list[tuple[str, int]]:
    """Go's gRPC read/write buffer sizes as gRPC core arguments: how much a connection reads from
    its socket, and gathers before writing, at a time (0: gRPC's own)."""
    options = []
    if read_buffer_size:
        options.append(("grpc.experimental.tcp_read_chunk_size", read_buffer_size))
    if write_buffer_size:
        options.append(("grpc.http2.write_buffer_size", write_buffer_size))
    return options


# -- gRPC -----------------------------------------------------------------------------------------


class KeepaliveServerParameters(ComponentConfig):
    # A connection idle this long is closed; one this old is closed (after the grace) so clients
    # rebalance; time/timeout: the server pings an idle client and waits this long for the answer.
    max_connection_idle: NonNegativeDuration = 0.0
    max_connection_age: NonNegativeDuration = 0.0
    max_connection_age_grace: NonNegativeDuration = 0.0
    time: NonNegativeDuration = 0.0
    timeout: NonNegativeDuration = 0.0


class KeepaliveEnforcementPolicy(ComponentConfig):
    # Clients pinging more often than this are disconnected; permit_without_stream: pings with no RPC open are allowed.
    min_time: NonNegativeDuration = 0.0
    permit_without_stream: bool = False


class KeepaliveServer(WithOptionalSections):
    server_parameters: OptionalSection[KeepaliveServerParameters] = None
    enforcement_policy: OptionalSection[KeepaliveEnforcementPolicy] = None


def grpc_keepalive_options(keepalive: KeepaliveServer | None) -> list[tuple[str, int]]:
    """The gRPC core arguments for Go's keepalive settings (milliseconds; 0 leaves gRPC's own)."""
    if keepalive is None:
        return []
    options = []
    parameters = keepalive.server_parameters
    if parameters is not None:
        for key, argument in (("max_connection_idle", "grpc.max_connection_idle_ms"), ("max_connection_age", "grpc.max_connection_age_ms"),
                              ("max_connection_age_grace", "grpc.max_connection_age_grace_ms"), ("time", "grpc.keepalive_time_ms"),
                              ("timeout", "grpc.keepalive_timeout_ms")):
            if getattr(parameters, key):
                options.append((argument, int(getattr(parameters, key) * 1000)))
    policy = keepalive.enforcement_policy
    if policy is not None:
        if policy.min_time:
            options.append(("grpc.http2.min_ping_interval_without_data_ms", int(policy.min_time * 1000)))
        options.append(("grpc.keepalive_permit_without_calls", int(policy.permit_without_stream)))
    return options


# -- HTTP -----------------------------------------------------------------------------------------


class CorsSettings(ComponentConfig):
    """confighttp.CORSConfig: browsers on these origins may send (``*`` wildcards: ``https://*.example.com``)."""

    allowed_origins: list[str] = []
    allowed_headers: list[str] = []
    exposed_headers: list[str] = []
    # How long a browser may cache the answer to a preflight request, in seconds (0: not said).
    max_age: int = pydantic.Field(0, ge=0)

    def origin_allowed(self, origin: str) -> bool:
        return any(re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), origin) for pattern in self.allowed_origins)


def response_header_map(value: Any) -> Any:
    """Go's response_headers: a map, or a list of {name, value}; names case-insensitively unique."""
    if value is None:
        return {}
    if isinstance(value, list):
        pairs = {}
        for entry in value:
            if not isinstance(entry, dict) or set(entry) - {"name", "value"} or "name" not in entry:
                raise ValueError("expected a map of header names to values, or a list of {name, value}")
            if str(entry["name"]).lower() in {str(name).lower() for name in pairs}:
                raise ValueError(f"duplicate header name {entry['name']!r}")
            pairs[entry["name"]] = entry.get("value", "")
        value = pairs
    if isinstance(value, dict):
        seen = set()
        for name in value:
            if str(name).lower() in seen:
                raise ValueError(f"duplicate header name {name!r}")
            seen.add(str(name).lower())
    return value
