"""The ``retry_on_failure`` and ``sending_queue`` sections every queued exporter shares.

Keys and defaults are the Go collector's ``configretry.BackOffConfig`` and exporterhelper queue
settings, so a Go exporter config runs unchanged.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from pycollector.component import ComponentConfig, OptionalSection, only_go_default
from pycollector.config.servers import WithOptionalSections
from pycollector.config.types import Duration, NonNegativeDuration

DEFAULT_INITIAL_INTERVAL = 5.0
DEFAULT_RANDOMIZATION_FACTOR = 0.5
DEFAULT_MULTIPLIER = 1.5
DEFAULT_MAX_INTERVAL = 30.0
DEFAULT_MAX_ELAPSED_TIME = 300.0

DEFAULT_NUM_CONSUMERS = 10
# Counted in requests (one message handed to the exporter), as the Go queue's default sizer.
DEFAULT_QUEUE_SIZE = 1000


class RetrySettings(ComponentConfig):
    enabled: bool = True
    initial_interval: NonNegativeDuration = DEFAULT_INITIAL_INTERVAL
    # Each wait is the interval stretched or shrunk by up to this fraction, so many exporters
    # failing together do not retry in lockstep.
    randomization_factor: float = pydantic.Field(DEFAULT_RANDOMIZATION_FACTOR, ge=0, le=1)
    multiplier: float = pydantic.Field(DEFAULT_MULTIPLIER, ge=0)
    max_interval: NonNegativeDuration = DEFAULT_MAX_INTERVAL
    # How long one request may be retried before it is dropped; 0 retries forever.
    max_elapsed_time: NonNegativeDuration = DEFAULT_MAX_ELAPSED_TIME

    @pydantic.model_validator(mode="after")
    def _elapsed_time_fits_the_intervals(self) -> "RetrySettings":
        if self.enabled and self.max_elapsed_time > 0:
            if self.max_elapsed_time < self.initial_interval:
                raise ValueError("'max_elapsed_time' must not be less than 'initial_interval'")
            if self.max_elapsed_time < self.max_interval:
                raise ValueError("'max_elapsed_time' must not be less than 'max_interval'")
        return self


_WaitForResult = only_go_default(False, "consume returns once the request is queued; the batch processor's send is the pipeline's")
_NoPartitions = only_go_default([], "one batch for every client (partition by metadata with the batch processor's metadata_keys)",
                                lambda value: value or [])
DEFAULT_FLUSH_TIMEOUT = 0.2
DEFAULT_MIN_SIZE = 8192


class Partition(ComponentConfig):
    metadata_keys: _NoPartitions = None


class QueueBatchSettings(ComponentConfig):
    """Go's ``sending_queue::batch``: the queue's consumers merge what is waiting into one
    request of at least ``min_size`` (counted by ``sizer``), sent when it is that big or when
    ``flush_timeout`` has passed since its first request, and never made bigger than ``max_size``
    by merging (0: no bound)."""

    flush_timeout: Duration = pydantic.Field(DEFAULT_FLUSH_TIMEOUT, gt=0)
    # items (spans, points, records, samples) or bytes; by default the queue's, when that is one of them.
    sizer: Literal["items", "bytes"] | None = None
    min_size: int = pydantic.Field(DEFAULT_MIN_SIZE, ge=0)
    max_size: int = pydantic.Field(0, ge=0)
    partition: Partition = Partition()

    @pydantic.model_validator(mode="after")
    def _min_within_max(self) -> "QueueBatchSettings":
        if self.max_size and self.max_size < self.min_size:
            raise ValueError(f"max_size ({self.max_size}) must be 0 or at least min_size ({self.min_size})")
        return self


class QueueSettings(WithOptionalSections):
    enabled: bool = True
    wait_for_result: _WaitForResult = None
    # Merge queued requests before sending them (Go's exporter-side batching; off unless written).
    batch: OptionalSection[QueueBatchSettings] = None
    num_consumers: int = pydantic.Field(DEFAULT_NUM_CONSUMERS, ge=1)
    queue_size: int = pydantic.Field(DEFAULT_QUEUE_SIZE, ge=1)
    # When full: False refuses the new request at once (counted as enqueue_failed), True makes
    # the pipeline wait for room.
    block_on_overflow: bool = False
    # What queue_size counts: requests, bytes (serialized) or items (spans, points, records,
    # samples).
    sizer: Literal["requests", "bytes", "items"] = "requests"
    # A storage extension (file_storage/NAME, listed in service::extensions) that keeps the queue
    # across restarts and crashes; none: the queue lives in memory.
    storage: str | None = None

    @pydantic.field_validator("storage")
    @classmethod
    def _an_extension_id(cls, storage: str | None) -> str | None:
        if storage is not None and not storage.strip():
            raise ValueError("must name a storage extension (file_storage or file_storage/NAME), not be empty")
        return storage

    @pydantic.model_validator(mode="after")
    def _batching_an_in_memory_queue(self) -> "QueueSettings":
        if self.batch is None:
            return self
        if self.storage is not None:
            raise ValueError("batch: not supported by pycollector with a persistent queue (storage): put the batch processor before the exporter")
        if self.batch.sizer is None and "sizer" in self.model_fields_set and self.sizer == "requests":
            raise ValueError("batch: counts items or bytes, and would take the queue's sizer 'requests': set batch::sizer")
        if self.batch_sizer() == self.sizer and self.batch.min_size > self.queue_size:
            raise ValueError(f"batch::min_size ({self.batch.min_size}) must not exceed queue_size ({self.queue_size}), both counting {self.sizer}")
        return self

    def batch_sizer(self) -> str:
        """What the batch counts: its own sizer, else the queue's when it is items or bytes, else items (as Go)."""
        if self.batch is None or self.batch.sizer is not None:
            return self.batch.sizer if self.batch is not None else "items"
        return self.sizer if self.sizer in ("items", "bytes") else "items"

