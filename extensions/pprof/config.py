"""Settings of the pprof extension, with the Go extension's keys and defaults."""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig, not_supported
from pycollector.http_server import Endpoint

DEFAULT_ENDPOINT = "localhost:1777"


_ListenerDialerTimeout = not_supported("a dialer timeout does not apply to an endpoint that listens (Go ignores it too)")


class _Dialer(ComponentConfig):
    timeout: _ListenerDialerTimeout = None


class PprofExtensionConfig(ComponentConfig):
    endpoint: Endpoint = DEFAULT_ENDPOINT
    dialer: _Dialer | None = None
    # Go's runtime samples blocking events and mutex contention (SetBlockProfileRate,
    # SetMutexProfileFraction); CPython has no such hooks. 0 or less (off) is what Go's default
    # does, and so does this extension; more is refused rather than accepted and ignored.
    block_profile_fraction: int = 0
    mutex_profile_fraction: int = 0
    # A file to write a CPU profile of the whole run to (gzipped pprof), at shutdown; "" for none.
    save_to_file: str = ""

    @pydantic.field_validator("block_profile_fraction", "mutex_profile_fraction")
    @classmethod
    def _off_only(cls, value: int) -> int:
        if value > 0:
            raise ValueError("not supported by pycollector: CPython has no block or mutex profiles (0 or less turns them off, as in Go)")
        return value
