"""Which collections to watch, with which selectors: pods always; ReplicaSets, namespaces, nodes
and the workloads (Deployments, StatefulSets, DaemonSets, Jobs) only when the extract rules need
them (each is RBAC the collector must be granted)."""

from __future__ import annotations

from processors.k8sattributes.config import FROM_REPLICASET, WORKLOADS, K8sAttributesConfig
from processors.k8sattributes.rules import ExtractionRules
from processors.k8sattributes.store import KUBE_SYSTEM
from pycollector.kubernetes.watch import Collection

LABEL_SELECTOR_FORMS = {"": "{key}={value}", "equals": "{key}={value}", "not-equals": "{key}!={value}", "exists": "{key}", "does-not-exist": "!{key}"}
FIELD_SELECTOR_FORMS = {"": "{key}={value}", "equals": "{key}={value}", "not-equals": "{key}!={value}"}


def collections_to_watch(config: K8sAttributesConfig, rules: ExtractionRules) -> list[Collection]:
    node, namespace = config.filter.node_name(), config.filter.namespace
    in_namespace = f"/namespaces/{namespace}" if namespace else ""
    pod_fields = [f"spec.nodeName={node}"] if node else []
    pod_fields += [FIELD_SELECTOR_FORMS[f.op].format(key=f.key, value=f.value) for f in config.filter.fields]
    pod_labels = [LABEL_SELECTOR_FORMS[f.op].format(key=f.key, value=f.value) for f in config.filter.labels]
    watched = [Collection("pods", f"/api/v1{in_namespace}/pods", _selectors(pod_fields, pod_labels))]
    if rules.needs_replicasets:
        watched.append(Collection("replicasets", f"/apis/apps/v1{in_namespace}/replicasets"))
    for source, (collection, api) in WORKLOADS.items():
        if source != FROM_REPLICASET and rules.needs_workload(source):
            watched.append(Collection(collection, f"{api}{in_namespace}/{collection}"))
    if rules.needs_namespaces:
        # Only the cluster uid wanted: kube-system is the one namespace to watch.
        only_kube_system = not (rules.labels["namespace"] or rules.annotations["namespace"])
        watched.append(Collection("namespaces", "/api/v1/namespaces", _selectors([f"metadata.name={KUBE_SYSTEM}"] if only_kube_system else [], [])))
    if rules.needs_nodes:
        watched.append(Collection("nodes", "/api/v1/nodes", _selectors([f"metadata.name={node}"] if node else [], [])))
    return watched


def _selectors(fields: list[str], labels: list[str]) -> dict[str, str]:
    selectors = {"fieldSelector": ",".join(fields), "labelSelector": ",".join(labels)}
    return {name: value for name, value in selectors.items() if value}
