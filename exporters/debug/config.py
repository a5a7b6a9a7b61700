from typing import Any, Literal

from pycollector.component import ComponentConfig

DEFAULT_VERBOSITY = "basic"
DEFAULT_SAMPLING_INITIAL = 2
DEFAULT_SAMPLING_THEREAFTER = 1
DEFAULT_TOP_FUNCTIONS = 10


class DebugConfig(ComponentConfig):
    verbosity: Literal["basic", "normal", "detailed"] = DEFAULT_VERBOSITY
    # Per second, the first `sampling_initial` exports are printed, then every
    # `sampling_thereafter`-th, as the Go debug exporter's log sampling does.
    sampling_initial: int = DEFAULT_SAMPLING_INITIAL
    sampling_thereafter: int = DEFAULT_SAMPLING_THEREAFTER
    use_internal_logger: bool = True
    # How many functions `normal` lists per profile, by self samples.
    top_functions: int = DEFAULT_TOP_FUNCTIONS
    # Accepted for Go configs; the debug exporter prints synchronously.
    sending_queue: dict[str, Any] | None = None
