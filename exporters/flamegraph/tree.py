"""Stack values -> the JSON the page renders: per sample type, one call tree per process.

Nodes are in d3-flame-graph's input format (``name``, ``value`` including children,
``children``) plus ``libtype``, which it colours by (``kernel`` frames orange). The page shows one
sample type at a time and merges the trees of the processes the filter selects, so the server
sends each process once per type and the same document works as a saved file with no server
behind it.

    {"host", "window_seconds", "generated_unix", "spans_cut",
     "types": [{"id": "samples", "type": "samples", "unit": "count", "snapshot": false, "total",
                "processes": [{"pid", "name", "container", "resource", "total", "stacks",
                               "groups": [{"attributes", "total", "stacks"}, ...]}, ...],
                "spans": [{"trace_id", "span_id", "pid", "name", "container", "attributes",
                           "total", "stacks"}, ...],
                "segments": [{"start_unix", "end_unix",
                              "processes": [[process index, [[stack index, value], ...]], ...]}, ...]}, ...],
     "frames": [[name, libtype], ...], "stacks": [[frame index, ...], ...]}

Types come in display order (CPU first; the first is what the page shows unless asked:
sample_types.display_order). ``snapshot`` marks a type whose values are readings of a level (the
live heap's in-use bytes): the page compares two times by each process's latest reading in each
range, and by the values themselves rather than their shares (a leak grows the level).

``total`` is in the type's unit: samples for CPU, nanoseconds for off-CPU time. ``groups`` (only
for a process whose samples carry span attributes) splits its stacks by those attributes
(``http.route``...), for the page's attribute filter. ``spans`` are the type's MAX_SPANS_SHOWN
spans with the most samples in the window, each with its own call tree.

For comparisons: ``resource`` is the process's resource attributes (``comparable_attributes``),
and ``segments`` the window in time steps, each with the stacks per process (an index into the
type's ``processes``) as indexes into the document's ``stacks`` (root first, indexes into
``frames``). Stacks as a table rather than trees: a stack seen in every segment is sent once.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from pycollector.pdata import display_order, is_snapshot

from exporters.flamegraph.window import ProcessKey, ProcessStacks, SampleType, Segment, Stack, Totals, merged

MAX_SPANS_SHOWN = 100


def page_data(totals: Totals, window_seconds: float, host: str, spans_cut: int = 0, segments: list[Segment] = (),
              resources: dict[ProcessKey, dict[str, str]] | None = None) -> dict[str, Any]:
    ordered = sorted(totals, key=display_order)
    ids = type_ids(ordered)
    table = StackTable()
    types = []
    for value_type in ordered:
        keyed = [(key, process_data(key, stacks, (resources or {}).get(key, {}))) for key, stacks in totals[value_type].items()]
        keyed.sort(key=lambda entry: (-entry[1]["total"], entry[1]["name"]))
        index = {key: position for position, (key, _) in enumerate(keyed)}
        processes = [process for _, process in keyed]
        types.append({
            "id": ids[value_type],
            "type": value_type[0],
            "unit": value_type[1],
            "snapshot": is_snapshot(value_type),
            "total": sum(process["total"] for process in processes),
            "processes": processes,
            "spans": top_spans(totals[value_type]),
            "segments": [segment_data(segment, value_type, index, table) for segment in segments if segment.totals.get(value_type)],
        })
    return {"host": host, "window_seconds": window_seconds, "generated_unix": time.time(), "spans_cut": spans_cut, "types": types,
            "frames": table.frames, "stacks": table.stacks}


class StackTable:
    """Frames and stacks numbered as they are first met, for the document's ``frames`` and
    ``stacks``."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, str]] = []
        self.stacks: list[list[int]] = []
        self._frame_ids: dict[tuple[str, str], int] = {}
        self._stack_ids: dict[Stack, int] = {}

    def stack_id(self, stack: Stack) -> int:
        found = self._stack_ids.get(stack)
        if found is None:
            found = self._stack_ids[stack] = len(self.stacks)
            self.stacks.append([self._frame_id(frame) for frame in stack])
        return found

    def _frame_id(self, frame: tuple[str, str]) -> int:
        found = self._frame_ids.get(frame)
        if found is None:
            found = self._frame_ids[frame] = len(self.frames)
            self.frames.append(frame)
        return found


def segment_data(segment: Segment, value_type: SampleType, process_index: dict[ProcessKey, int], table: StackTable) -> dict[str, Any]:
    """One time segment of a type: each process's stacks (processes that left the window's totals
    are not in it: a segment is never wider than the window)."""
    processes = [[process_index[key], [[table.stack_id(stack), value] for stack, value in stacks.items()]]
                 for key, stacks in segment.totals[value_type].items() if key in process_index]
    return {"start_unix": segment.start_unix, "end_unix": segment.end_unix, "processes": processes}


def type_ids(value_types: list[SampleType]) -> dict[SampleType, str]:
    """What the page's URL fragment names a type by (``#type=off_cpu``): its name, or name/unit
    when another type has the same name or it has none."""
    names = collections.Counter(type_ for type_, _ in value_types)
    return {(type_, unit): type_ if type_ and names[type_] == 1 else f"{type_}/{unit}" for type_, unit in value_types}


def process_data(key: ProcessKey, by_span: ProcessStacks, resource: dict[str, str] | None = None) -> dict[str, Any]:
    stacks = merged(by_span)
    data = {"pid": key.pid, "name": key.name, "container": key.container, "resource": resource or {},
            "total": sum(stacks.values()), "stacks": call_tree(stacks)}
    groups: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for span, span_stacks in by_span.items():
        groups[span.attributes].update(span_stacks)
    if any(groups):  # (some samples carry span attributes)
        data["groups"] = sorted(({"attributes": dict(attributes), "total": sum(group.values()), "stacks": call_tree(group)}
                                 for attributes, group in groups.items()), key=lambda group: -group["total"])
    return data


def top_spans(processes: dict[ProcessKey, ProcessStacks]) -> list[dict[str, Any]]:
    """The spans with the most samples of this type, each with its call tree. A span whose
    attributes changed while it ran (http.route set after it started) is one span: its stacks
    together, the attributes of its most samples over the others'."""
    by_id: dict[tuple, list] = {}
    for key, by_span in processes.items():
        for span, stacks in by_span.items():
            if span.span_id:
                by_id.setdefault((key, span.trace_id, span.span_id), []).append((sum(stacks.values()), span.attributes, stacks))
    spans = []
    for (key, trace_id, span_id), variants in by_id.items():
        variants.sort(key=lambda variant: variant[0])
        stacks: collections.Counter = collections.Counter()
        attributes: dict = {}
        for _, variant_attributes, variant_stacks in variants:
            stacks.update(variant_stacks)
            attributes.update(variant_attributes)
        spans.append((sum(stacks.values()), key, trace_id, span_id, attributes, stacks))
    spans.sort(key=lambda entry: (-entry[0], entry[3]))
    return [{"trace_id": trace_id, "span_id": span_id, "pid": key.pid, "name": key.name, "container": key.container,
             "attributes": attributes, "total": total, "stacks": call_tree(stacks)}
            for total, key, trace_id, span_id, attributes, stacks in spans[:MAX_SPANS_SHOWN]]


def call_tree(stacks: dict[Stack, int]) -> list[dict[str, Any]]:
    """The root's children: each node's value is its own value plus its callees'."""
    root: dict[str, Any] = {"children": {}}
    for stack, count in stacks.items():
        node = root
        for name, frame_type in stack:
            child = node["children"].get(name)
            if child is None:
                child = node["children"][name] = {"name": name, "value": 0, "libtype": frame_type, "children": {}}
            child["value"] += count
            node = child
    return _as_lists(root)["children"]


def _as_lists(node: dict[str, Any]) -> dict[str, Any]:
    """Children keyed by name while building, a list for the renderer; iterative, as a deep
    recursive stack (kernel + native frames) must not meet Python's recursion limit."""
    pending = [node]
    while pending:
        current = pending.pop()
        children = list(current["children"].values())
        current["children"] = children
        pending.extend(children)
    return node
