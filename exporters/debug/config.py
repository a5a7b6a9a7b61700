from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig, not_supported

DEFAULT_VERBOSITY = "basic"
DEFAULT_SAMPLING_INITIAL = 2
DEFAULT_SAMPLING_THEREAFTER = 1
DEFAULT_TOP_FUNCTIONS = 10
_NoQueue = not_supported("the debug exporter prints each message as it comes; it has no queue")


class DebugConfig(ComponentConfig):
    verbosity: Literal["basic", "normal", "detailed"] = DEFAULT_VERBOSITY
    # Per second, the first `sampling_initial` exports are printed, then every
    # `sampling_thereafter`-th, as the Go debug exporter's log sampling does.
    sampling_initial: int = DEFAULT_SAMPLING_INITIAL
    sampling_thereafter: int = DEFAULT_SAMPLING_THEREAFTER
    # true: through the collector's own log (stderr, its format); false: as plain text to
    # output_paths ("stdout", "stderr" or files, appended), as Go's separate console logger.
    use_internal_logger: bool = True
    output_paths: list[str] | None = None
    # How many functions `normal` lists per profile, by self samples.
    top_functions: int = DEFAULT_TOP_FUNCTIONS
    # Go's queue in front of the printing: refused by name (this exporter prints as data comes).
    sending_queue: _NoQueue = None

    @pydantic.field_validator("output_paths", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        # As Go's config decoding: a string where a list is expected is split on commas.
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else value

    @pydantic.model_validator(mode="after")
    def _paths_need_their_own_logger(self) -> "DebugConfig":
        if self.output_paths is not None:
            if self.use_internal_logger:
                raise ValueError("output_paths is only valid when use_internal_logger is false")
            if not self.output_paths:
                raise ValueError("output_paths must not be empty (leave it out for stdout)")
        return self
