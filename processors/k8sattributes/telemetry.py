"""What the k8sattributes processor reports, with the Go processor's metric names.

    otelcol_otelsvc_k8s_<kind>_{added,updated,deleted}  watch events received (pod, namespace, node, and the workloads watched)
    otelcol_otelsvc_k8s_pod_table_size                  pods known
    otelcol_otelsvc_k8s_ip_lookup_miss                  a resource named a pod that is not known
    otelcol_k8s_pod_association{status, otelcol_signal} resources enriched (success) or not (error)
"""

from __future__ import annotations

from pycollector.telemetry import ComponentTelemetry

KINDS = {"pods": "pod", "namespaces": "namespace", "nodes": "node", "replicasets": "replicaset", "deployments": "deployment",
         "statefulsets": "statefulset", "daemonsets": "daemonset", "jobs": "job"}
EVENTS = {"added": "add", "updated": "update", "deleted": "delete"}  # metric suffix -> event named in its help
SUCCESS, ERROR = "success", "error"


class K8sTelemetry:
    def __init__(self, telemetry: ComponentTelemetry):
        self._events = {
            (collection, event): telemetry.counter(f"otelcol_otelsvc_k8s_{kind}_{event}", f"Number of {kind} {verb} events received")
            for collection, kind in KINDS.items()
            for event, verb in EVENTS.items()
        }
        self._table_size = telemetry.gauge("otelcol_otelsvc_k8s_pod_table_size", "Size of table containing pod info")
        self._lookup_miss = telemetry.counter("otelcol_otelsvc_k8s_ip_lookup_miss", "Number of times pod by IP lookup failed.")
        self._association = telemetry.counter(
            "otelcol_k8s_pod_association", "Resources the processor did (success) or did not (error) find a pod for", ("status", "otelcol_signal")
        )

    def event(self, collection: str, event: str) -> None:
        self._events[(collection, event)].inc()

    def pod_table_size(self, size: int) -> None:
        self._table_size.set(size)

    def lookup_miss(self) -> None:
        self._lookup_miss.inc()

    def association(self, found: bool, signal: str) -> None:
        self._association.labels(status=SUCCESS if found else ERROR, otelcol_signal=signal).inc()
