"""Settings of the memory limiter, named as the Go ``memory_limiter`` processor's.

Two deviations from Go, both so that an empty ``memory_limiter:`` is a valid config (the engine's
component contract requires the defaults to validate):
- ``check_interval`` defaults to 1s (Go has no default and requires it to be set above zero);
- with neither ``limit_mib`` nor ``limit_percentage`` set, the limit is
  ``FALLBACK_LIMIT_PERCENTAGE`` of the memory available, with a warning at start (Go refuses
  the config).
"""

from __future__ import annotations

from typing import Annotated

import pydantic

from pycollector.component import ComponentConfig
from pycollector.config.types import Duration, NonNegativeDuration

DEFAULT_CHECK_INTERVAL = 1.0
DEFAULT_MIN_GC_INTERVAL_WHEN_SOFT_LIMITED = 10.0
DEFAULT_MIN_GC_INTERVAL_WHEN_HARD_LIMITED = 0.0
FALLBACK_LIMIT_PERCENTAGE = 80
# A spike limit of 0 means this share of the limit, as in Go.
DEFAULT_SPIKE_SHARE = 0.2

_UINT32 = 2**32 - 1
_Percentage = Annotated[int, pydantic.Field(ge=0, le=100)]


class MemoryLimiterConfig(ComponentConfig):
    # How often memory is measured. Data is refused from the first check above the soft limit
    # to the first check below it.
    check_interval: Duration = pydantic.Field(DEFAULT_CHECK_INTERVAL, gt=0)
    # The hard limit in MiB; when set, it wins over limit_percentage.
    limit_mib: int = pydantic.Field(0, ge=0, le=_UINT32)
    # How much memory may grow between two checks; the soft limit is limit - spike.
    spike_limit_mib: int = pydantic.Field(0, ge=0, le=_UINT32)
    # The hard limit and the spike as percentages of the cgroup limit, or of total memory.
    limit_percentage: _Percentage = 0
    spike_limit_percentage: _Percentage = 0
    # Forced garbage collections are at least this far apart.
    min_gc_interval_when_soft_limited: NonNegativeDuration = DEFAULT_MIN_GC_INTERVAL_WHEN_SOFT_LIMITED
    min_gc_interval_when_hard_limited: NonNegativeDuration = DEFAULT_MIN_GC_INTERVAL_WHEN_HARD_LIMITED

    @pydantic.field_validator("spike_limit_mib")
    @classmethod
    def _spike_below_limit(cls, spike: int, info: pydantic.ValidationInfo) -> int:
        limit = info.data.get("limit_mib")
        if limit and spike >= limit:
            raise ValueError(f"must be smaller than limit_mib ({limit})")
        return spike

    @pydantic.field_validator("spike_limit_percentage")
    @classmethod
    def _spike_percentage_below_limit(cls, spike: int, info: pydantic.ValidationInfo) -> int:
        if info.data.get("limit_mib") or "limit_percentage" not in info.data:
            return spike  # percentages are not used, or the limit itself is wrong
        limit = info.data["limit_percentage"]
        if spike >= (limit or FALLBACK_LIMIT_PERCENTAGE):
            which = limit or f"unset, so {FALLBACK_LIMIT_PERCENTAGE}"
            raise ValueError(f"must be smaller than limit_percentage ({which})")
        return spike

    @pydantic.field_validator("min_gc_interval_when_hard_limited")
    @classmethod
    def _hard_interval_not_above_soft(cls, hard: float, info: pydantic.ValidationInfo) -> float:
        soft = info.data.get("min_gc_interval_when_soft_limited")
        if soft is not None and hard > soft:
            raise ValueError("must not be larger than min_gc_interval_when_soft_limited")
        return hard
