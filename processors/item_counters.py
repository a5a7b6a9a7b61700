"""Per-signal counters with the Go collector's processor names: ``otelcol_processor_<outcome>_<items>``.

The engine already counts items into and out of every processor; a processor that refuses or
drops data says so with these (``otelcol_processor_refused_spans``, ``..._dropped_profile_samples``).
"""

from __future__ import annotations

from typing import Any

from pycollector.pdata import ITEM_NAMES
from pycollector.telemetry import ComponentTelemetry


def item_counters(telemetry: ComponentTelemetry, outcome: str, meaning: str) -> dict[str, Any]:
    """One counter per signal, created up front so dashboards see a 0 before the first event.

    ``meaning`` finishes the sentence "Number of <items> ...", e.g. "refused by the memory limiter".
    """
    return {
        signal: telemetry.counter(
            f"otelcol_processor_{outcome}_{items}", f"Number of {items.replace('_', ' ')} {meaning}."
        )
        for signal, items in ITEM_NAMES.items()
    }
