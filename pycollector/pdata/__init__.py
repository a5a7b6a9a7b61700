"""Helpers over the OTLP protobuf messages that flow through pipelines.

The payload is the OTLP message itself (no parallel object model); this package is the one place
that knows how to build, merge, count and read it.
"""

from pycollector.pdata.attributes import from_any_value, key_values, to_any_value, to_dict
from pycollector.pdata.builder import ProfilesBuilder, merge
from pycollector.pdata.counting import ITEM_NAMES, RESOURCE_FIELDS, item_count, resource_entries, sample_count, signal_of
from pycollector.pdata.resolve import Frame, SampleView, frames_of, iter_samples, sample_type
from pycollector.pdata.sample_types import (ALLOC_OBJECTS, ALLOC_SPACE, CPU_SAMPLES, CPU_TIME, HEAP_TYPES, INUSE_OBJECTS, INUSE_SPACE,
                                            GOROUTINES, IO_WAIT, LOCK_WAIT, LOCK_WAKE, MARKER_FRAME_TYPE, OFF_CPU_TIME, THREADS, display_order, is_memory,
                                            is_snapshot)
from pycollector.pdata.split import split_at
from pycollector.pdata.validate import validate_indices

__all__ = [
    "ITEM_NAMES",
    "RESOURCE_FIELDS",
    "Frame",
    "ProfilesBuilder",
    "SampleView",
    "frames_of",
    "from_any_value",
    "item_count",
    "iter_samples",
    "key_values",
    "merge",
    "resource_entries",
    "sample_count",
    "sample_type",
    "ALLOC_OBJECTS",
    "ALLOC_SPACE",
    "CPU_SAMPLES",
    "CPU_TIME",
    "GOROUTINES",
    "HEAP_TYPES",
    "INUSE_OBJECTS",
    "INUSE_SPACE",
    "IO_WAIT",
    "LOCK_WAIT",
    "LOCK_WAKE",
    "MARKER_FRAME_TYPE",
    "OFF_CPU_TIME",
    "THREADS",
    "display_order",
    "is_memory",
    "is_snapshot",
    "signal_of",
    "split_at",
    "to_any_value",
    "to_dict",
    "validate_indices",
]
