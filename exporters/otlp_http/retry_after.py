"""The HTTP Retry-After header: a number of seconds, or a date to come back at."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait, or None when the header is absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - (time.time() if now is None else now))
