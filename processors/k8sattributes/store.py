"""The local copy of the cluster the processor reads: pods indexed by identifier, and the
ReplicaSets, namespaces and nodes their attributes come from.

Watcher threads write (as the `Sink` of ``watch``), pipeline threads read; one lock keeps each
lookup consistent with the indexes.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from processors.k8sattributes.association import Associations, Identifier
from processors.k8sattributes.config import FROM_DEPLOYMENT, FROM_REPLICASET, WORKLOADS
from processors.k8sattributes.rules import ExtractionRules, OwnerRecord, PodRecord, ReplicaSetRecord, WorkloadRecord, trim_pod
from processors.k8sattributes.telemetry import K8sTelemetry
from pycollector.kubernetes.watch import DELETED

KUBE_SYSTEM = "kube-system"  # its uid is the cluster's uid (k8s.cluster.uid)


class MetadataStore:
    def __init__(self, rules: ExtractionRules, associations: Associations, telemetry: K8sTelemetry,
                 delete_grace_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self._rules, self._associations, self._telemetry = rules, associations, telemetry
        self._lock = threading.Lock()
        # Pods deleted, by uid: when. Their records stay for delete_grace_s (Go's pod_delete_grace_period).
        self._deleted: dict[str, float] = {}
        self._delete_grace_s = delete_grace_s
        self._clock = clock
        self._pods: dict[str, PodRecord] = {}  # by uid
        self._raw_pods: dict[str, dict] = {}  # by uid, trimmed; re-derived when their ReplicaSet changes
        self._identifiers: dict[str, set[Identifier]] = {}  # pod uid -> identifiers it is indexed under
        self._index: dict[Identifier, str] = {}  # identifier -> pod uid
        self._pods_of_replicaset: dict[str, set[str]] = {}
        self._replicasets: dict[str, ReplicaSetRecord] = {}  # by uid
        self._namespaces: dict[str, OwnerRecord] = {}  # by name
        self._nodes: dict[str, OwnerRecord] = {}  # by name
        # Deployments, StatefulSets, DaemonSets and Jobs, by source ("deployment") and uid.
        self._workloads: dict[str, dict[str, WorkloadRecord]] = {source: {} for source in WORKLOADS if source != FROM_REPLICASET}
        self._kinds: dict[str, tuple[dict, Callable[[dict], str], Callable[[dict], None], Callable[[str], None]]] = {
            "pods": (self._pods, _uid, self._put_pod, self._drop_pod),
            "replicasets": (self._replicasets, _uid, self._put_replicaset, self._replicasets.pop),
            "namespaces": (self._namespaces, _name, self._put_namespace, self._namespaces.pop),
            "nodes": (self._nodes, _name, self._put_node, self._nodes.pop),
            **{WORKLOADS[source][0]: (table, _uid, self._workload_putter(source), table.pop) for source, table in self._workloads.items()},
        }

    # -- the watchers' side ----------------------------------------------------------------

    def replace(self, kind: str, objects: list[dict]) -> None:
        """A fresh list: what is missing from it was deleted while we were not watching."""
        table, key_of, put, drop = self._kinds[kind]
        with self._lock:
            self._forget_deleted_pods()
            listed = {key_of(obj) for obj in objects}
            for key in [key for key in table if key not in listed]:
                if kind == "pods" and self._delete_grace_s > 0:
                    if key not in self._deleted:
                        self._deleted[key] = self._clock()
                        self._telemetry.event(kind, "deleted")
                    continue
                drop(key)
                self._telemetry.event(kind, "deleted")
            for obj in objects:
                self._telemetry.event(kind, "updated" if key_of(obj) in table else "added")
                put(obj)
            self._telemetry.pod_table_size(len(self._pods))

    def apply(self, kind: str, event_type: str, obj: dict) -> None:
        table, key_of, put, drop = self._kinds[kind]
        key = key_of(obj)
        with self._lock:
            self._forget_deleted_pods()
            if event_type == DELETED:
                if kind == "pods" and self._delete_grace_s > 0:
                    if key in table:
                        self._deleted[key] = self._clock()
                elif key in table:
                    drop(key)
                self._telemetry.event(kind, "deleted")
            else:
                self._telemetry.event(kind, "updated" if key in table else "added")
                self._deleted.pop(key, None)
                put(obj)
            self._telemetry.pod_table_size(len(self._pods))

    def _forget_deleted_pods(self) -> None:
        """Drop the pods whose grace after deletion is over (under the lock)."""
        if not self._deleted:
            return
        expired = [uid for uid, when in self._deleted.items() if self._clock() - when >= self._delete_grace_s]
        for uid in expired:
            del self._deleted[uid]
            if uid in self._pods:
                self._drop_pod(uid)
        if expired:
            self._telemetry.pod_table_size(len(self._pods))

    def _put_pod(self, raw: dict) -> None:
        trimmed = trim_pod(raw)
        pod = self._rules.pod(trimmed, self._replicasets)
        previous = self._pods.get(pod.uid)
        if previous is not None and previous.replicaset_uid != pod.replicaset_uid:
            self._unlink_replicaset(previous)
        if pod.replicaset_uid:
            self._pods_of_replicaset.setdefault(pod.replicaset_uid, set()).add(pod.uid)
        self._raw_pods[pod.uid] = trimmed
        self._index_pod(pod)

    def _index_pod(self, pod: PodRecord) -> None:
        identifiers = self._associations.of_pod(pod)
        for stale in self._identifiers.get(pod.uid, set()) - identifiers:
            if self._index.get(stale) == pod.uid:
                del self._index[stale]
        for identifier in identifiers:
            holder = self._pods.get(self._index.get(identifier, ""))
            # Two pods can claim one identifier (an IP reused while the old pod's delete is still
            # on its way): the pod that started later keeps it.
            if holder is None or holder.uid == pod.uid or holder.start_time <= pod.start_time:
                self._index[identifier] = pod.uid
        self._identifiers[pod.uid] = identifiers
        self._pods[pod.uid] = pod

    def _drop_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid)
        self._raw_pods.pop(uid, None)
        self._unlink_replicaset(pod)
        for identifier in self._identifiers.pop(uid, set()):
            if self._index.get(identifier) == uid:
                del self._index[identifier]

    def _unlink_replicaset(self, pod: PodRecord) -> None:
        pods = self._pods_of_replicaset.get(pod.replicaset_uid)
        if pods is not None:
            pods.discard(pod.uid)
            if not pods:
                del self._pods_of_replicaset[pod.replicaset_uid]

    def _put_replicaset(self, raw: dict) -> None:
        replicaset = self._rules.replicaset(raw)
        self._replicasets[replicaset.uid] = replicaset
        # A pod listed before its ReplicaSet has no Deployment yet: derive it again now.
        for uid in self._pods_of_replicaset.get(replicaset.uid, set()):
            self._index_pod(self._rules.pod(self._raw_pods[uid], self._replicasets))

    def _put_namespace(self, raw: dict) -> None:
        namespace = self._rules.namespace(raw)
        self._namespaces[namespace.name] = namespace

    def _workload_putter(self, source: str) -> Callable[[dict], None]:
        table = self._workloads[source]

        def put(raw: dict) -> None:
            record = self._rules.workload(raw, source)
            table[record.uid] = record

        return put

    def _put_node(self, raw: dict) -> None:
        node = self._rules.node(raw)
        self._nodes[node.name] = node

    # -- the pipeline's side ---------------------------------------------------------------

    def pod(self, identifier: Identifier) -> PodRecord | None:
        """The pod an identifier names; None (and a miss counted) when it is not known."""
        with self._lock:
            self._forget_deleted_pods()
            uid = self._index.get(identifier)
            pod = self._pods.get(uid) if uid else None
        if pod is None:
            self._telemetry.lookup_miss()
            return None
        return None if pod.ignored else pod

    def workloads_of(self, pod: PodRecord) -> list[tuple[str, ReplicaSetRecord | WorkloadRecord]]:
        """The pod's workloads the store knows, as (source, record): its ReplicaSet and that
        ReplicaSet's Deployment, its StatefulSet, DaemonSet or Job."""
        with self._lock:
            found: list[tuple[str, ReplicaSetRecord | WorkloadRecord]] = []
            replicaset = self._replicasets.get(pod.replicaset_uid) if pod.replicaset_uid else None
            if replicaset is not None:
                found.append((FROM_REPLICASET, replicaset))
                deployment = self._workloads[FROM_DEPLOYMENT].get(replicaset.deployment_uid)
                if deployment is not None:
                    found.append((FROM_DEPLOYMENT, deployment))
            for source, uid in pod.owners:
                record = self._workloads[source].get(uid)
                if record is not None:
                    found.append((source, record))
            return found

    def namespace(self, name: str) -> OwnerRecord | None:
        with self._lock:
            return self._namespaces.get(name)

    def node(self, name: str) -> OwnerRecord | None:
        with self._lock:
            return self._nodes.get(name)

    def cluster_uid(self) -> str:
        kube_system = self.namespace(KUBE_SYSTEM)
        return kube_system.uid if kube_system else ""


def _uid(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")
