"""Stack counts -> the JSON the page renders: one call tree per process.

Nodes are in d3-flame-graph's input format (``name``, ``value`` including children,
``children``) plus ``libtype``, which it colours by (``kernel`` frames orange). The page merges
the trees of the processes the filter selects, so the server sends each process once and the
same document works as a saved file with no server behind it.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from exporters.flamegraph.window import ProcessKey, Stack


def page_data(totals: dict[ProcessKey, collections.Counter], window_seconds: float, host: str) -> dict[str, Any]:
    processes = []
    for key, stacks in totals.items():
        processes.append({
            "pid": key.pid,
            "name": key.name,
            "container": key.container,
            "samples": sum(stacks.values()),
            "stacks": call_tree(stacks),
        })
    processes.sort(key=lambda process: (-process["samples"], process["name"]))
    return {"host": host, "window_seconds": window_seconds, "generated_unix": time.time(), "processes": processes}


def call_tree(stacks: collections.Counter) -> list[dict[str, Any]]:
    """The root's children: each node's value is its samples including its callees'."""
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
