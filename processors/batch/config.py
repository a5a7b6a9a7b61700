"""Settings of the batch processor, named and defaulted as the Go ``batch`` processor's."""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig
from pycollector.config.types import NonNegativeDuration

DEFAULT_TIMEOUT = 0.2
DEFAULT_SEND_BATCH_SIZE = 8192
DEFAULT_SEND_BATCH_MAX_SIZE = 0  # no limit
DEFAULT_METADATA_CARDINALITY_LIMIT = 1000

_UINT32 = 2**32 - 1


class BatchConfig(ComponentConfig):
    # A batch goes out this long after the previous one at the latest; 0 sends every message
    # as soon as it arrives.
    timeout: NonNegativeDuration = DEFAULT_TIMEOUT
    # A batch goes out as soon as it holds this many items; 0 ignores the size (send at once).
    send_batch_size: int = pydantic.Field(DEFAULT_SEND_BATCH_SIZE, ge=0, le=_UINT32)
    # Larger batches are cut into batches of at most this many items; 0 means no limit.
    send_batch_max_size: int = pydantic.Field(DEFAULT_SEND_BATCH_MAX_SIZE, ge=0, le=_UINT32)
    # One batch per distinct combination of these keys' values in the sender's request metadata
    # (the otlp receiver keeps it with include_metadata: true), at most metadata_cardinality_limit
    # combinations; data bringing one more is refused for good.
    metadata_keys: list[str] = []
    metadata_cardinality_limit: int = pydantic.Field(
        DEFAULT_METADATA_CARDINALITY_LIMIT, ge=0, le=_UINT32
    )

    @pydantic.field_validator("send_batch_max_size")
    @classmethod
    def _max_not_below_size(cls, value: int, info: pydantic.ValidationInfo) -> int:
        size = info.data.get("send_batch_size")
        if value and size is not None and value < size:
            raise ValueError(
                f"{value} is below send_batch_size ({size}): use at least {size}, or 0 for no limit"
            )
        return value

    @pydantic.field_validator("metadata_keys")
    @classmethod
    def _keys_unique(cls, keys: list[str]) -> list[str]:
        seen: set[str] = set()
        for key in keys:
            if key.lower() in seen:
                raise ValueError(f"duplicate entry {key.lower()!r} (keys are case-insensitive)")
            seen.add(key.lower())
        return keys

