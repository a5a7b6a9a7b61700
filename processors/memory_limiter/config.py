"""Settings of the memory limiter, named as the Go ``memory_limiter`` processor's.

As in Go, a config must give ``check_interval`` and ``limit_mib`` or ``limit_percentage``. The
defaults built in code (not from a config) have a 1s check and, with no limit,
``FALLBACK_LIMIT_PERCENTAGE`` of the memory available, with a warning at start.

Forced collections back off as Go's do: after one that leaves memory above the limit, the next
waits twice as long, from ``min_gc_interval_when_*_limited`` up to ``max_gc_interval_when_*_limited``
(0: no back-off), and back to the minimum once memory is below the limit.
"""

from __future__ import annotations

from typing import Annotated

import pydantic

from pycollector.component import ComponentConfig
from pycollector.config.types import Duration, NonNegativeDuration

DEFAULT_CHECK_INTERVAL = 1.0
DEFAULT_MIN_GC_INTERVAL_WHEN_SOFT_LIMITED = 10.0
DEFAULT_MIN_GC_INTERVAL_WHEN_HARD_LIMITED = 0.0
DEFAULT_MAX_GC_INTERVAL = 30.0
FALLBACK_LIMIT_PERCENTAGE = 80
# A spike limit of 0 means this share of the limit, as in Go.
DEFAULT_SPIKE_SHARE = 0.2

_UINT32 = 2**32 - 1
_Percentage = Annotated[int, pydantic.Field(ge=0, le=100)]


class MemoryLimiterConfig(ComponentConfig):
    required_as_written = ("check_interval", ("limit_mib", "limit_percentage"))
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
    # Back-off of forced collections that do not bring memory under the limit (0: none).
    max_gc_interval_when_soft_limited: NonNegativeDuration = DEFAULT_MAX_GC_INTERVAL
    max_gc_interval_when_hard_limited: NonNegativeDuration = DEFAULT_MAX_GC_INTERVAL

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

    @pydantic.model_validator(mode="after")
    def _back_off_bounds(self) -> "MemoryLimiterConfig":
        for kind in ("soft", "hard"):
            low, high = getattr(self, f"min_gc_interval_when_{kind}_limited"), getattr(self, f"max_gc_interval_when_{kind}_limited")
            if high and high < low:
                raise ValueError(f"max_gc_interval_when_{kind}_limited must be at least min_gc_interval_when_{kind}_limited (or 0 to disable)")
        soft, hard = self.max_gc_interval_when_soft_limited, self.max_gc_interval_when_hard_limited
        if soft and hard and soft < hard:
            raise ValueError("max_gc_interval_when_soft_limited must be at least max_gc_interval_when_hard_limited (when both are set)")
        return self
