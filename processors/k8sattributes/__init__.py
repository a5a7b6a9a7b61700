"""The k8sattributes processor: Kubernetes metadata (pod, container, workload, namespace, node,
service) on the resource of every message, found by watching the Kubernetes API and matching
resources to pods by container id, pod IP or pod uid, as the Go ``k8sattributes`` processor does."""
