"""What a Kubernetes object contributes to a resource, and which source wins (the Go processor's rules).

A pod's attributes are computed when the pod (or the ReplicaSet it belongs to) changes, never per
message. Later steps overwrite earlier ones, which is how precedence is expressed:

    service.name     resource.opentelemetry.io/service.name annotation
                   > app.kubernetes.io/instance label > app.kubernetes.io/name label
                   > Deployment > ReplicaSet > StatefulSet > DaemonSet > CronJob > Job > pod name
    service.version  annotation > app.kubernetes.io/version label > the container's image tag/digest
    service.instance.id  annotation > <namespace>.<pod>.<container>
    service.namespace    annotation > the pod's namespace

(The container-level and namespace-level values are only filled where the pod left them unset,
see ``enrich``.) Labels and annotations copied by `extract.labels`/`annotations` are applied in
that order too: configured labels, well-known labels, then annotations.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from processors.k8sattributes.config import (
    FROM_DEPLOYMENT,
    FROM_JOB,
    FROM_NAMESPACE,
    FROM_NODE,
    FROM_POD,
    FROM_REPLICASET,
    WORKLOADS,
    ExtractConfig,
    FieldExtractConfig,
)

# Where labels and annotations may be read: the pod, its namespace and node, and its workloads.
SOURCES = (FROM_POD, FROM_NAMESPACE, FROM_NODE, *WORKLOADS)
# A pod's owner kinds (ownerReferences) that are workloads of their own.
OWNER_SOURCES = {"StatefulSet": "statefulset", "DaemonSet": "daemonset", "Job": FROM_JOB}
from processors.k8sattributes.images import parse_image

IGNORE_ANNOTATION = "opentelemetry.io/k8s-processor/ignore"
OTEL_ANNOTATION_PREFIX = "resource.opentelemetry.io/"
# A Job made by a CronJob is named <cronjob>-<scheduled time>.
CRONJOB_JOB_NAME = re.compile(r"^(.*)-\d+$")
# A ReplicaSet made by a Deployment is named <deployment>-<10 character pod-template hash>.
DEPLOYMENT_REPLICASET_NAME = re.compile(r"^(.*)-[a-z0-9]{10}$")


@dataclasses.dataclass(frozen=True)
class ContainerRun:
    """One run of a container (its restart count is the key): the id the runtime gave it."""

    container_id: str
    repo_digest: str


@dataclasses.dataclass(frozen=True)
class Container:
    attributes: dict[str, str]  # k8s.container.name, container.image.*, service.version/instance.id
    runs: dict[int, ContainerRun]


@dataclasses.dataclass(frozen=True)
class PodRecord:
    uid: str
    name: str
    namespace: str
    node: str
    ip: str
    host_network: bool
    start_time: str  # RFC 3339; the newer pod wins an identifier two pods claim
    ignored: bool
    replicaset_uid: str
    # The pod's other workload owners: (source, uid), e.g. ("statefulset", "..."), for labels and
    # annotations read from them.
    owners: tuple[tuple[str, str], ...]
    attributes: dict[str, str]
    containers_by_id: dict[str, Container]  # runtime prefix ("containerd://") stripped
    containers_by_name: dict[str, Container]


@dataclasses.dataclass(frozen=True)
class ReplicaSetRecord:
    uid: str
    name: str
    deployment_name: str
    deployment_uid: str
    attributes: dict[str, str] = dataclasses.field(default_factory=dict)  # its labels and annotations extracted


@dataclasses.dataclass(frozen=True)
class WorkloadRecord:
    """A Deployment, StatefulSet, DaemonSet or Job: its labels and annotations extracted; a Job's
    CronJob, when a CronJob made it."""

    uid: str
    attributes: dict[str, str]
    cronjob_uid: str = ""


@dataclasses.dataclass(frozen=True)
class OwnerRecord:
    """A namespace or a node: what it adds to the resources of its pods."""

    name: str
    uid: str
    attributes: dict[str, str]


class FieldRule:
    """One `extract.labels`/`annotations` entry, applied to one kind of object's map."""

    def __init__(self, rule: FieldExtractConfig, default_prefix: str):
        self.tag_name, self.key = rule.tag_name, rule.key
        self.key_regex = re.compile(f"^(?:{rule.key_regex})$") if rule.key_regex else None
        self.default_prefix = default_prefix  # "k8s.pod.labels." -> k8s.pod.labels.<key>

    @classmethod
    def otel_annotations(cls) -> "FieldRule":
        rule = FieldExtractConfig(tag_name="$1", key_regex=re.escape(OTEL_ANNOTATION_PREFIX) + "(.+)")
        return cls(rule, "k8s.pod.annotations.")

    def extract(self, values: Mapping[str, str], into: dict[str, str]) -> None:
        if self.key_regex is None:
            if self.key in values:
                into[self.tag_name or self.default_prefix + self.key] = values[self.key]
            return
        for key, value in values.items():
            match = self.key_regex.match(key)
            if match and value:
                # Capture groups make tag_name a template ($1, ${name}); without them the key is
                # named by the default scheme, as in Go.
                name = _expand(self.tag_name, match) if self.key_regex.groups else ""
                into[name or self.default_prefix + key] = value


def _expand(template: str, match: re.Match) -> str:
    """Go's Regexp.Expand: $1, ${1}, $name, ${name}; $$ is a literal $; unknown groups are empty."""

    def group(reference: re.Match) -> str:
        if reference.group(0) == "$$":
            return "$"
        name = reference.group(1) or reference.group(2)
        try:
            return match.group(int(name) if name.isdigit() else name) or ""
        except IndexError:
            return ""

    return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", group, template)


class ExtractionRules:
    """`extract` (and `exclude`) turned into what to take from pods, namespaces, nodes, ReplicaSets."""

    def __init__(self, extract: ExtractConfig, excluded_pod_names: list[str]):
        self.metadata = frozenset(extract.metadata)
        self.deployment_name_from_replicaset = extract.deployment_name_from_replicaset
        self.labels = {source: self._rules(extract.labels, source, "labels") for source in SOURCES}
        self.annotations = {source: self._rules(extract.annotations, source, "annotations") for source in SOURCES}
        if extract.otel_annotations:
            self.annotations[FROM_POD].append(FieldRule.otel_annotations())
        self.excluded = [re.compile(name) for name in excluded_pod_names]

    @staticmethod
    def _rules(rules: list[FieldExtractConfig], source: str, what: str) -> list[FieldRule]:
        return [FieldRule(rule, f"k8s.{source}.{what}.") for rule in rules if getattr(rule, "from") == source]

    def wants(self, key: str) -> bool:
        return key in self.metadata

    @property
    def needs_namespaces(self) -> bool:
        return bool(self.labels[FROM_NAMESPACE] or self.annotations[FROM_NAMESPACE]) or self.wants("k8s.cluster.uid")

    @property
    def needs_nodes(self) -> bool:
        return bool(self.labels[FROM_NODE] or self.annotations[FROM_NODE]) or self.wants("k8s.node.uid")

    @property
    def needs_replicasets(self) -> bool:
        """The Deployment of a pod is only known through its ReplicaSet's owner."""
        by_name = self.wants("k8s.deployment.name") or self.wants("service.name")
        return (self.wants("k8s.deployment.uid") or (by_name and not self.deployment_name_from_replicaset)
                or self.reads_from(FROM_REPLICASET) or self.needs_workload(FROM_DEPLOYMENT))

    def reads_from(self, source: str) -> bool:
        return bool(self.labels[source] or self.annotations[source])

    def needs_workload(self, source: str) -> bool:
        """Whether a workload collection (deployments, statefulsets, daemonsets, jobs) is watched."""
        return self.reads_from(source) or (source == FROM_JOB and self.wants("k8s.cronjob.uid"))

    # -- objects ------------------------------------------------------------------------

    def replicaset(self, raw: dict) -> ReplicaSetRecord:
        meta = raw.get("metadata") or {}
        deployment = _controller(meta, "Deployment")
        return ReplicaSetRecord(meta.get("uid", ""), meta.get("name", ""), deployment.get("name", ""), deployment.get("uid", ""),
                                self._owner_record(raw, FROM_REPLICASET).attributes)

    def workload(self, raw: dict, source: str) -> WorkloadRecord:
        meta = raw.get("metadata") or {}
        cronjob = _controller(meta, "CronJob") if source == FROM_JOB else {}
        return WorkloadRecord(meta.get("uid", ""), self._owner_record(raw, source).attributes, cronjob.get("uid", ""))

    def namespace(self, raw: dict) -> OwnerRecord:
        return self._owner_record(raw, FROM_NAMESPACE)

    def node(self, raw: dict) -> OwnerRecord:
        return self._owner_record(raw, FROM_NODE)

    def _owner_record(self, raw: dict, source: str) -> OwnerRecord:
        meta = raw.get("metadata") or {}
        attributes: dict[str, str] = {}
        for rule in self.labels[source]:
            rule.extract(meta.get("labels") or {}, attributes)
        for rule in self.annotations[source]:
            rule.extract(meta.get("annotations") or {}, attributes)
        return OwnerRecord(meta.get("name", ""), meta.get("uid", ""), attributes)

    def pod(self, raw: dict, replicasets: Mapping[str, ReplicaSetRecord]) -> PodRecord:
        meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        ignored = self._ignored(name, meta.get("annotations") or {})
        replicaset = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "ReplicaSet"), {})
        by_id, by_name = ({}, {}) if ignored else self._containers(name, namespace, spec, status)
        return PodRecord(
            uid=meta.get("uid", ""),
            name=name,
            namespace=namespace,
            node=spec.get("nodeName", ""),
            ip=status.get("podIP", ""),
            host_network=bool(spec.get("hostNetwork")),
            start_time=status.get("startTime") or meta.get("creationTimestamp") or "",
            ignored=ignored,
            replicaset_uid=replicaset.get("uid", ""),
            owners=tuple((OWNER_SOURCES[ref["kind"]], ref.get("uid", "")) for ref in meta.get("ownerReferences") or [] if ref.get("kind") in OWNER_SOURCES),
            attributes={} if ignored else self._pod_attributes(meta, spec, status, replicasets),
            containers_by_id=by_id,
            containers_by_name=by_name,
        )

    def _ignored(self, name: str, annotations: Mapping[str, str]) -> bool:
        if annotations.get(IGNORE_ANNOTATION, "").strip().lower() == "true":
            return True
        return any(pattern.search(name) for pattern in self.excluded)

    def _pod_attributes(self, meta: dict, spec: dict, status: dict, replicasets: Mapping[str, ReplicaSetRecord]) -> dict[str, str]:
        attributes: dict[str, str] = {}

        def put(key: str, value: Any) -> None:
            if value and self.wants(key):
                attributes[key] = str(value)

        put("k8s.pod.name", meta.get("name"))
        put("service.name", meta.get("name"))
        put("k8s.pod.hostname", spec.get("hostname"))
        put("k8s.pod.ip", status.get("podIP"))
        put("k8s.namespace.name", meta.get("namespace"))
        put("k8s.pod.start_time", meta.get("creationTimestamp"))
        put("k8s.pod.uid", meta.get("uid"))
        put("k8s.node.name", spec.get("nodeName"))
        for owner in meta.get("ownerReferences") or []:
            self._owner_attributes(owner, replicasets, put)
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        for rule in self.labels[FROM_POD]:
            rule.extract(labels, attributes)
        for label in ("app.kubernetes.io/name", "app.kubernetes.io/instance"):  # instance wins
            put("service.name", labels.get(label))
        put("service.version", labels.get("app.kubernetes.io/version"))
        for rule in self.annotations[FROM_POD]:
            rule.extract(annotations, attributes)
        return attributes

    def _owner_attributes(self, owner: dict, replicasets: Mapping[str, ReplicaSetRecord], put) -> None:
        kind, name, uid = owner.get("kind"), owner.get("name", ""), owner.get("uid", "")
        if kind == "ReplicaSet":
            put("k8s.replicaset.name", name)
            put("k8s.replicaset.uid", uid)
            put("service.name", name)
            known = replicasets.get(uid)
            deployment_name = known.deployment_name if known else ""
            if self.deployment_name_from_replicaset:
                match = DEPLOYMENT_REPLICASET_NAME.match(name)
                deployment_name = match.group(1) if match else ""
            put("k8s.deployment.name", deployment_name)
            put("service.name", deployment_name)  # the Deployment wins over its ReplicaSet
            put("k8s.deployment.uid", known.deployment_uid if known else "")
        elif kind in ("DaemonSet", "StatefulSet", "Job"):
            prefix = f"k8s.{kind.lower()}"
            put(f"{prefix}.name", name)
            put(f"{prefix}.uid", uid)
            put("service.name", name)
            if kind == "Job" and (match := CRONJOB_JOB_NAME.match(name)):
                put("k8s.cronjob.name", match.group(1))
                put("service.name", match.group(1))  # the CronJob wins over its Job

    def _containers(self, pod_name: str, namespace: str, spec: dict, status: dict) -> tuple[dict[str, Container], dict[str, Container]]:
        """Containers by runtime id and by name; ids are indexed even when no container key is
        extracted, because `pod_association` may match on container.id alone."""
        specs = {c.get("name", ""): c for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])}
        runs_by_name: dict[str, dict[int, ContainerRun]] = {}
        ids_by_name: dict[str, list[str]] = {}
        for container_status in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
            name = container_status.get("name", "")
            container_id = strip_runtime(container_status.get("containerID", ""))
            repo_digest = _repo_digest(container_status.get("imageID", "")) if self.wants("container.image.repo_digests") else ""
            runs_by_name.setdefault(name, {})[int(container_status.get("restartCount") or 0)] = ContainerRun(
                container_id if self.wants("container.id") else "", repo_digest
            )
            if container_id:
                ids_by_name.setdefault(name, []).append(container_id)
        by_name = {
            name: Container(self._container_attributes(pod_name, namespace, name, specs.get(name, {}), name in runs_by_name), runs_by_name.get(name, {}))
            for name in {*specs, *runs_by_name}
        }
        by_id = {container_id: by_name[name] for name, ids in ids_by_name.items() for container_id in ids}
        return by_id, by_name

    def _container_attributes(self, pod_name: str, namespace: str, name: str, spec: dict, has_status: bool) -> dict[str, str]:
        attributes: dict[str, str] = {}
        image = parse_image(spec.get("image", ""))
        candidates = {
            # Go learns the name and instance id from the container's status, i.e. once it ran.
            "k8s.container.name": name if has_status else "",
            "service.instance.id": f"{namespace}.{pod_name}.{name}" if has_status else "",
            "container.image.name": image.repository if image else "",
            "container.image.tag": image.tag if image else "",
            "service.version": image.service_version if image else "",
        }
        for key, value in candidates.items():
            if value and self.wants(key):
                attributes[key] = value
        return attributes


def trim_pod(raw: dict) -> dict:
    """Only the fields these rules read: a pod kept for later re-derivation costs less memory."""
    meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}

    def pick(source: dict, keys: tuple[str, ...]) -> dict:
        return {key: source[key] for key in keys if key in source}

    def containers(items: list | None, keys: tuple[str, ...]) -> list[dict]:
        return [pick(item, keys) for item in items or []]

    spec_keys, status_keys = ("name", "image"), ("name", "containerID", "restartCount", "imageID")
    return {
        "metadata": pick(meta, ("name", "namespace", "uid", "creationTimestamp", "labels", "annotations", "ownerReferences")),
        "spec": {
            **pick(spec, ("nodeName", "hostname", "hostNetwork")),
            "containers": containers(spec.get("containers"), spec_keys),
            "initContainers": containers(spec.get("initContainers"), spec_keys),
        },
        "status": {
            **pick(status, ("podIP", "startTime")),
            "containerStatuses": containers(status.get("containerStatuses"), status_keys),
            "initContainerStatuses": containers(status.get("initContainerStatuses"), status_keys),
        },
    }


def strip_runtime(container_id: str) -> str:
    """`containerd://4f1c...` -> `4f1c...`: resources carry the bare id the runtime uses."""
    return container_id.split("://", 1)[1] if "://" in container_id else container_id


def _repo_digest(image_id: str) -> str:
    """`docker-pullable://registry/app@sha256:...` -> `registry/app@sha256:...`, else ""."""
    reference = strip_runtime(image_id)
    return reference if "@sha256:" in reference else ""


def _controller(meta: dict, kind: str) -> dict:
    return next((ref for ref in meta.get("ownerReferences") or [] if ref.get("kind") == kind and ref.get("controller")), {})
