"""The pipeline graph: which component instance feeds which, and the order to start and stop them.

Nodes are component *instances*: one per receiver, exporter and connector id (shared by every
pipeline that lists it), and one per processor per pipeline (as in the Go collector). Edges point
downstream. Instances are created and started sinks first (reverse topological order), so every
component's next consumer exists and runs before anything can push into it; shutdown goes the
other way, so what a component flushes while stopping lands in consumers that are still running.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from pycollector.component import SOLE_WORKER, Settings, StartError, WorkerSlot
from pycollector.config.errors import ConfigError
from pycollector.config.validate import ComponentSpec, Plan
from pycollector.consumers import Fanout, Parsing, SignalRouter
from pycollector.logs import get_logger
from pycollector.obsreport import ExporterObserver, ProcessorObserver, ReceiverObserver
from pycollector.telemetry import Telemetry


@dataclasses.dataclass(frozen=True)
class NodeKey:
    kind: str
    id: str
    pipeline: str = ""  # processors only: each pipeline has its own instance

    def __str__(self) -> str:
        where = f" in pipeline {self.pipeline}" if self.pipeline else ""
        return f"{self.kind}::{self.id}{where}"


@dataclasses.dataclass
class Node:
    key: NodeKey
    spec: ComponentSpec
    component: Any = None
    consumer: Any = None  # what upstream calls: the component wrapped in its counters


class Graph:
    def __init__(self, plan: Plan, telemetry: Telemetry, worker: WorkerSlot = SOLE_WORKER):
        self.plan = plan
        self.telemetry = telemetry
        self.worker = worker
        self.nodes: dict[NodeKey, Node] = {}
        self.edges: dict[NodeKey, list[NodeKey]] = defaultdict(list)
        self._mutates_memo: dict[NodeKey, bool] = {}
        self._add_nodes_and_edges()
        self.order = self._topological_order()  # upstream first

    # -- shape -------------------------------------------------------------------------------

    def _add_nodes_and_edges(self) -> None:
        for pipeline in self.plan.pipelines.values():
            receivers = [self._node(self._kind_of(name, "receivers"), name) for name in pipeline.receivers]
            processors = [self._node("processors", name, pipeline.id) for name in pipeline.processors]
            exporters = [self._node(self._kind_of(name, "exporters"), name) for name in pipeline.exporters]
            for receiver in receivers:
                self._edge(receiver, processors[0] if processors else exporters)
            for upstream, downstream in zip(processors, processors[1:]):
                self._edge(upstream, downstream)
            if processors:
                self._edge(processors[-1], exporters)

    def _kind_of(self, name: str, default: str) -> str:
        return default if (default, name) in self.plan.components else "connectors"

    def _node(self, kind: str, name: str, pipeline: str = "") -> NodeKey:
        key = NodeKey(kind, name, pipeline)
        if key not in self.nodes:
            self.nodes[key] = Node(key, self.plan.component(kind, name))
        return key

    def _edge(self, upstream: NodeKey, downstream: NodeKey | list[NodeKey]) -> None:
        for target in downstream if isinstance(downstream, list) else [downstream]:
            if target not in self.edges[upstream]:
                self.edges[upstream].append(target)

    def _topological_order(self) -> list[NodeKey]:
        """Kahn's algorithm; a cycle can only come from connectors and is a config error."""
        incoming = {key: 0 for key in self.nodes}
        for targets in self.edges.values():
            for target in targets:
                incoming[target] += 1
        ready = [key for key, count in incoming.items() if count == 0]
        order = []
        while ready:
            key = ready.pop(0)
            order.append(key)
            for target in self.edges[key]:
                incoming[target] -= 1
                if incoming[target] == 0:
                    ready.append(target)
        if len(order) != len(self.nodes):
            cyclic = sorted(str(key) for key, count in incoming.items() if count > 0)
            raise ConfigError([f"service::pipelines: connectors form a cycle through {', '.join(cyclic)}"])
        return order

    # -- instances -----------------------------------------------------------------------------

    def create(self) -> None:
        """Instantiate every component, sinks first, each with its next consumer."""
        for key in reversed(self.order):
            try:
                self._create(self.nodes[key])
            except Exception as error:  # a plugin may raise anything; the user needs the place
                raise StartError(f"{key}: cannot create: {error}") from error

    def _create(self, node: Node) -> None:
        key, spec = node.key, node.spec
        component_telemetry = self.telemetry.for_component(spec.kind, str(spec.id))
        logger = get_logger(component=spec.path)
        settings = Settings(spec.id, spec.kind, logger, component_telemetry, self.worker)
        if key.kind == "exporters":
            node.component = spec.factory.create(settings, spec.config, None)
            # An exporter with a sending queue counts sent/failed itself, when the send happens;
            # counting at consume() would count what was merely queued.
            counts_itself = getattr(node.component, "reports_sent_items", False)
            node.consumer = node.component if counts_itself else ExporterObserver(node.component, component_telemetry)
        elif key.kind == "processors":
            observer = ProcessorObserver(None, component_telemetry)
            node.component = spec.factory.create(settings, spec.config, observer.outgoing(self._downstream(key)))
            observer.processor = node.component
            node.consumer = observer
        elif key.kind == "receivers":
            node.component = spec.factory.create(settings, spec.config, ReceiverObserver(self._router(key), component_telemetry))
        else:  # connectors: an exporter of some pipelines, a receiver of others
            node.component = spec.factory.create(settings, spec.config, self._router(key))
            node.consumer = node.component
        if node.consumer is not None and not spec.factory.takes_serialized_profiles:
            node.consumer = Parsing(node.consumer)

    def _downstream(self, key: NodeKey) -> Any:
        targets = [self.nodes[target] for target in self.edges[key]]
        if len(targets) == 1:
            return targets[0].consumer
        mutates = any(self._mutates(target.key) for target in targets)
        return Fanout([target.consumer for target in targets], copy_for_each=mutates)

    def _mutates(self, key: NodeKey) -> bool:
        """Whether data handed to this node may be edited by it or anything after it.

        A fan-out must copy when any branch edits *anywhere* downstream, not only right after the
        split: ``[memory_limiter, resource]`` edits in its second processor."""
        if key not in self._mutates_memo:
            self._mutates_memo[key] = self.nodes[key].spec.factory.mutates_data or any(self._mutates(target) for target in self.edges[key])
        return self._mutates_memo[key]

    def _router(self, key: NodeKey) -> SignalRouter:
        """For a receiver or connector: per signal, fan out to the start of each pipeline it feeds."""
        per_signal: dict[str, list[Node]] = defaultdict(list)
        for pipeline in self.plan.pipelines.values():
            if key.id not in pipeline.receivers:
                continue
            if pipeline.processors:
                entries = [self.nodes[NodeKey("processors", pipeline.processors[0], pipeline.id)]]
            else:
                entries = [self.nodes[NodeKey(self._kind_of(name, "exporters"), name)] for name in pipeline.exporters]
            for entry in entries:
                if entry not in per_signal[pipeline.signal]:
                    per_signal[pipeline.signal].append(entry)
        routes = {}
        for signal, entries in per_signal.items():
            mutates = any(self._mutates(entry.key) for entry in entries)
            routes[signal] = entries[0].consumer if len(entries) == 1 else Fanout([e.consumer for e in entries], copy_for_each=mutates)
        return SignalRouter(routes)

    def start_order(self) -> list[Node]:
        return [self.nodes[key] for key in reversed(self.order)]

    def shutdown_order(self) -> list[Node]:
        return [self.nodes[key] for key in self.order]
