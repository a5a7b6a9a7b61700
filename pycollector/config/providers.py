"""Where a ``--config`` comes from, as the Go collector's confmap providers read it.

    configs/agent.yaml      a file (no scheme)
    file:configs/agent.yaml the same
    env:COLLECTOR_CONFIG    the YAML held by an environment variable
    yaml:exporters::debug::verbosity: detailed     YAML written inline
    http://host/agent.yaml, https://...            fetched with GET; the body is YAML

As in Go, a scheme is two characters or more, so a Windows-style ``C:\\config.yaml`` stays a path,
and an unknown scheme is an error rather than a file name. Keys may use ``::`` to nest (Go's key
delimiter): ``exporters::debug::verbosity: detailed`` is ``{exporters: {debug: {verbosity: ...}}}``,
in a file as in ``yaml:``.
"""

from __future__ import annotations

import os
import re

SCHEMES = ("file", "env", "yaml", "http", "https")
# Go's confmap: a scheme, then ':'; one letter is a drive, not a scheme.
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):(.*)$", re.S)
HTTP_TIMEOUT_SECONDS = 10
# A config is a few kilobytes; a body past this is not one (and must not fill the agent's memory).
MAX_HTTP_BYTES = 16 * 1024 * 1024


class SourceError(Exception):
    """The config could not be read from where it was said to be; the message names it."""


def read_source(uri: str, env: dict[str, str] | None = None) -> tuple[str, bytes]:
    """(how messages name the source, its bytes)."""
    match = _URI.match(uri)
    if match is None:
        return uri, _read_file(uri)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return rest, _read_file(rest)
    if scheme == "env":
        value = (os.environ if env is None else env).get(rest)
        if value is None:
            raise SourceError(f"{uri}: environment variable {rest} is not set")
        return uri, value.encode()
    if scheme == "yaml":
        return "yaml:", rest.encode()
    if scheme in ("http", "https"):
        return uri, _fetch(uri)
    raise SourceError(f"{uri}: unsupported scheme '{scheme}' (supported: {', '.join(SCHEMES)}, or a file path)")


def _read_file(path: str) -> bytes:
    try:
        with open(os.path.expanduser(path), "rb") as stream:
            return stream.read()
    except OSError as error:
        raise SourceError(f"{path}: cannot read config file: {error.strerror}") from None
    except ValueError:  # a NUL character in the path
        raise SourceError(f"{path!r}: cannot read config file: the path holds a NUL character") from None


def _fetch(url: str) -> bytes:
    import requests

    try:
        with requests.get(url, timeout=HTTP_TIMEOUT_SECONDS, stream=True) as response:
            if response.status_code != 200:
                raise SourceError(f"{url}: HTTP {response.status_code} {response.reason}")
            body = response.raw.read(MAX_HTTP_BYTES + 1, decode_content=True)
    except requests.RequestException as error:
        raise SourceError(f"{url}: cannot fetch the config: {error}") from None
    if len(body) > MAX_HTTP_BYTES:
        raise SourceError(f"{url}: the body is larger than {MAX_HTTP_BYTES // (1024 * 1024)} MiB; not a config")
    return body


def nest_delimited_keys(node):
    """Keys written with Go's ``::`` delimiter as nested maps, merged with their siblings:
    ``{"a::b": 1, "a": {"c": 2}}`` is ``{"a": {"b": 1, "c": 2}}``."""
    from pycollector.config.loader import deep_merge

    if isinstance(node, list):
        return [nest_delimited_keys(item) for item in node]
    if not isinstance(node, dict):
        return node
    nested: dict = {}
    for key, value in node.items():
        value = nest_delimited_keys(value)
        if isinstance(key, str) and "::" in key:
            parts = key.split("::")
            for part in reversed(parts[1:]):
                value = {part: value}
            key = parts[0]
        nested[key] = deep_merge(nested[key], value) if key in nested else value
    return nested
