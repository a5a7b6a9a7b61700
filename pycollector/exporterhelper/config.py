"""The ``retry_on_failure`` and ``sending_queue`` sections every queued exporter shares.

Keys and defaults are the Go collector's ``configretry.BackOffConfig`` and exporterhelper queue
settings, so a Go exporter config runs unchanged.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from pycollector.component import ComponentConfig, not_supported, only_go_default
from pycollector.config.types import NonNegativeDuration

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
_QueueBatching = not_supported("requests are not merged in the queue: put the batch processor in the pipeline")


class QueueSettings(ComponentConfig):
    enabled: bool = True
    wait_for_result: _WaitForResult = None
    batch: _QueueBatching = None
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

