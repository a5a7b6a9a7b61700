"""Who sent the data being consumed: the client's address and, when a receiver is told to keep it
(`include_metadata`), its request metadata (gRPC metadata, HTTP headers).

The Go collector carries this in the request's context.Context; here it is a ContextVar that a
receiver sets around its call downstream. Components run on the caller's thread up to the first
one that holds data (batch, a sending queue), so every processor in between reads the sender of
the data it is handling with `current()`. A component that holds data and sends it later from its
own thread sets the context again for what it sends (batch does, with its `metadata_keys`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class ClientInfo:
    # The peer's IP address as text ("10.1.2.3", "::1"), or "" when unknown.
    address: str = ""
    # Metadata keys lower-cased, as gRPC metadata and HTTP/2 headers are; each key may repeat.
    metadata: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # What the receiver's authenticator said of the client (basicauth: ``username``).
    auth: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def get(self, key: str) -> tuple[str, ...]:
        """Every value of a metadata key, looked up case-insensitively (empty when absent)."""
        return self.metadata.get(key.lower(), ())


NO_CLIENT = ClientInfo()
_current: contextvars.ContextVar[ClientInfo] = contextvars.ContextVar("pycollector_client", default=NO_CLIENT)


def current() -> ClientInfo:
    return _current.get()


@contextlib.contextmanager
def client_context(info: ClientInfo) -> Iterator[None]:
    token = _current.set(info)
    try:
        yield
    finally:
        _current.reset(token)


def metadata_from_pairs(pairs: Iterable[tuple[str, str | bytes]]) -> dict[str, tuple[str, ...]]:
    """Metadata from (key, value) pairs, keys lower-cased and repeated keys kept in order.
    Binary gRPC metadata (keys ending in -bin) is left out: it is not text."""
    metadata: dict[str, list[str]] = {}
    for key, value in pairs:
        if isinstance(value, bytes):
            continue
        metadata.setdefault(key.lower(), []).append(value)
    return {key: tuple(values) for key, values in metadata.items()}


def address_from_grpc_peer(peer: str) -> str:
    """The IP in a gRPC peer string: "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000" ("" otherwise)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""
