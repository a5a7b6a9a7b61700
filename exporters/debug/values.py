"""Sample values as a person reads them, in their sample type's unit: a count as it is, time as
``2.50ms`` or ``1.00s`` (an off-CPU profile's values are nanoseconds: ``1002500000`` says little),
bytes as ``1.50MiB``. Three significant digits are plenty to compare functions. A memory profile's
total says what it is: ``100MiB allocated``, ``20 objects in use``."""

from __future__ import annotations

TO_NANOSECONDS = {"nanoseconds": 1, "microseconds": 1_000, "milliseconds": 1_000_000, "seconds": 1_000_000_000}
# Each scale's size in the base unit and its symbol, largest first; the flame graph page
# (assets/units.js) writes time the same way.
DURATION_SCALES = ((3600e9, "h"), (60e9, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1, "ns"))
BYTE_SCALES = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def format_value(value: int, unit: str) -> str:
    if unit in TO_NANOSECONDS:
        return _scaled(value * TO_NANOSECONDS[unit], DURATION_SCALES)
    if unit == "bytes":
        return _scaled(value, BYTE_SCALES)
    return str(value)


def _scaled(value: float, scales: tuple[tuple[float, str], ...]) -> str:
    size, symbol = next((scale for scale in scales if abs(value) >= scale[0]), scales[-1])
    number = value / size
    digits = 0 if size == 1 else 2 if abs(number) < 10 else 1 if abs(number) < 100 else 0
    return f"{number:.{digits}f}{symbol}"


# What a memory type's value is, said after it (the flame graph page's assets/units.js says the same);
# the threads' and goroutines' readings likewise (``56 threads``).
MEMORY_NOUNS = {"alloc_objects": "allocations", "alloc_space": "allocated", "inuse_objects": "objects in use", "inuse_space": "in use",
                "threads": "threads", "goroutines": "goroutines"}


def describe_total(value: int, value_type: tuple[str, str]) -> str:
    """``format_value`` and, for a memory type, what the value is: ``100MiB allocated``."""
    noun = MEMORY_NOUNS.get(value_type[0])
    return f"{format_value(value, value_type[1])} {noun}" if noun else format_value(value, value_type[1])
