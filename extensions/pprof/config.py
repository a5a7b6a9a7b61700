"""Settings of the pprof extension, with the Go extension's keys and defaults."""

from __future__ import annotations

from pycollector.component import ComponentConfig
from pycollector.http_server import Endpoint

DEFAULT_ENDPOINT = "localhost:1777"

# Go keys accepted for configs written for the Go collector, with no Python counterpart: Go's
# runtime samples blocking events and mutex contention (runtime.SetBlockProfileRate,
# SetMutexProfileFraction); CPython has no such hooks. A value > 0 is logged once as not implemented.
NOT_IMPLEMENTED = ("block_profile_fraction", "mutex_profile_fraction")


class PprofExtensionConfig(ComponentConfig):
    endpoint: Endpoint = DEFAULT_ENDPOINT
    # Go: a value <= 0 turns these profiles off, which is all this extension does with them.
    block_profile_fraction: int = 0
    mutex_profile_fraction: int = 0
    # A file to write a CPU profile of the whole run to (gzipped pprof), at shutdown; "" for none.
    save_to_file: str = ""

    def not_implemented(self) -> list[str]:
        """The keys set to something this extension would have to act on, and does not."""
        return [key for key in NOT_IMPLEMENTED if getattr(self, key) > 0]
