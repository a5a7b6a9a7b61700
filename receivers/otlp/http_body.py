"""Reading an OTLP/HTTP request body: its framing, the size limit, and its Content-Encoding.

The limit holds twice: on the bytes sent and on the bytes they decompress to, so a small gzip
or zstd body cannot expand into gigabytes (a decompression bomb).
"""

from __future__ import annotations

import zlib
from email.message import Message
from typing import BinaryIO

import zstandard

# zlib window bits per Content-Encoding: gzip framing, and the zlib framing HTTP calls deflate.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "zlib": zlib.MAX_WBITS}
# The Content-Encodings a body can be read in ("" and identity: none).
DECODABLE = ("", "gzip", "zstd", "zlib", "deflate")
_MAX_CHUNK_LINE = 1024
# zstd output is counted this much at a time: memory stays small whatever the limit.
_ZSTD_COUNT_STEP = 1 << 16


class BodyError(Exception):
    """The body cannot be used; ``status`` is the HTTP answer (400 or 413)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def read_body(stream: BinaryIO, headers: Message, limit: int, allowed: tuple[str, ...] | list[str] = DECODABLE) -> bytes:
    """The decompressed body of the request whose headers were read from ``stream``; a
    Content-Encoding not ``allowed`` (compression_algorithms) is refused."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        raw = _read_chunked(stream, limit)
    else:
        raw = _read_sized(stream, headers.get("Content-Length", "0"), limit)
    encoding = headers.get("Content-Encoding", "")
    if encoding.strip().lower() not in ("identity", *allowed):
        raise BodyError(400, f"unsupported Content-Encoding {encoding!r} (this receiver takes: {', '.join(name or 'none' for name in allowed)})")
    return _decompress(raw, encoding, limit)


def _too_large(limit: int) -> BodyError:
    return BodyError(413, f"the request body is larger than max_request_body_size ({limit} bytes)")


def _read_sized(stream: BinaryIO, length_header: str, limit: int) -> bytes:
    try:
        length = int(length_header)
    except ValueError:
        raise BodyError(400, f"invalid Content-Length {length_header!r}") from None
    if length < 0:
        raise BodyError(400, f"invalid Content-Length {length_header!r}")
    if length > limit:
        raise _too_large(limit)
    body = stream.read(length)
    if len(body) < length:
        raise BodyError(400, f"the body ended after {len(body)} of {length} bytes")
    return body


def _read_chunked(stream: BinaryIO, limit: int) -> bytes:
    body = bytearray()
    while True:
        line = stream.readline(_MAX_CHUNK_LINE)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BodyError(400, "invalid chunked encoding") from None
        if size == 0:
            while stream.readline(_MAX_CHUNK_LINE) not in (b"\r\n", b"\n", b""):
                pass  # trailer fields: nothing in OTLP uses them
            return bytes(body)
        if len(body) + size > limit:
            raise _too_large(limit)
        chunk = stream.read(size)
        if len(chunk) < size:
            raise BodyError(400, "the chunked body ended early")
        body += chunk
        stream.readline(_MAX_CHUNK_LINE)  # the CRLF that ends a chunk


def _decompress(raw: bytes, content_encoding: str, limit: int) -> bytes:
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "zstd":
        return _unzstd(raw, limit)
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise BodyError(400, f"unsupported Content-Encoding {content_encoding!r} (supported: gzip, deflate, zstd)")
    out = bytearray()
    remaining = raw
    while remaining:  # gzip allows several members back to back
        decompressor = zlib.decompressobj(wbits)
        try:
            out += decompressor.decompress(remaining, limit + 1 - len(out))
        except zlib.error as error:
            raise BodyError(400, f"cannot decompress the {encoding} body: {error}") from None
        if len(out) > limit:
            raise _too_large(limit)
        if not decompressor.eof:
            raise BodyError(400, f"the {encoding} body is truncated")
        remaining = decompressor.unused_data
    return bytes(out)


def _unzstd(raw: bytes, limit: int) -> bytes:
    """Two passes, because zstandard has no one call that does both: its stream reader stops at
    any size asked (the bomb check) but takes a cut-off frame for a short one; its decompressobj
    tells where each frame ends but returns all it decodes. The second pass runs only once the
    first has counted an output that fits the limit."""
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        size = 0
        while chunk := reader.read(_ZSTD_COUNT_STEP):
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
        out = bytearray()
        remaining = raw
        while remaining:  # frames may follow each other, as gzip members may
            decompressor = zstandard.ZstdDecompressor().decompressobj()
            out += decompressor.decompress(remaining)
            if not decompressor.eof:
                raise BodyError(400, "the zstd body is truncated")
            remaining = decompressor.unused_data
    except zstandard.ZstdError as error:
        raise BodyError(400, f"cannot decompress the zstd body: {error}") from None
    return bytes(out)
