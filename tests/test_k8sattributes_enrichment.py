"""What a resource gains from its pod: the checkout pod of the shop namespace, found by the
container id a profiler reports, by pod IP, or by pod uid; precedence of the service attributes;
nothing the sender set is overwritten."""

from __future__ import annotations

import copy

import pytest
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pycollector.client import ClientInfo, client_context
from pycollector.pdata import key_values

from processors.k8sattributes.config import ExtractConfig
from processors.k8sattributes.rules import ExtractionRules, ReplicaSetRecord
from tests.test_k8sattributes_fake_api import (
    BY_CONTAINER_ID,
    PROFILING_METADATA,
    FakeKubeApi,
    checkout_cluster,
    container_id,
    fixture,
    profile,
    running,
)

POD = fixture("pod-checkout.json")
CHECKOUT_ID = container_id(POD, "checkout")
ENVOY_ID = container_id(POD, "envoy")


@pytest.fixture(scope="module")
def cluster():
    with FakeKubeApi() as api:
        checkout_cluster(api)
        yield api


def profiling_config(api: FakeKubeApi, **overrides) -> dict:
    config = {
        "auth_type": "none",
        "endpoint": api.url,
        "wait_for_metadata": True,
        "filter": {"node": "node-a"},
        "extract": {"metadata": PROFILING_METADATA, "otel_annotations": True, "labels": [{"tag_name": "app.label.component", "key": "app.kubernetes.io/component"}]},
        "pod_association": BY_CONTAINER_ID,
    }
    return {**config, **overrides}


def test_a_profile_of_a_pods_container_gets_pod_container_workload_namespace_image_and_service(cluster):
    with running(profiling_config(cluster)) as processor:
        [resource] = processor.resources(profile(**{"container.id": CHECKOUT_ID, "process.pid": 4242}))
        assert processor.metric("otelcol_k8s_pod_association_total", status="success", otelcol_signal="profiles") == 1
    assert resource == {
        "container.id": CHECKOUT_ID,
        "process.pid": 4242,
        "k8s.pod.name": "checkout-6f7c9d8b4d-x2x9q",
        "k8s.pod.uid": "3c1e0f6a-6c2b-4a53-9d0e-2f6a1b7c8d90",
        "k8s.namespace.name": "shop",
        "k8s.node.name": "node-a",
        "k8s.deployment.name": "checkout",  # the ReplicaSet's owner
        "k8s.container.name": "checkout",
        "container.image.name": "ghcr.io/acme/checkout",
        "container.image.tag": "1.4.2",
        "container.image.repo_digests": ["ghcr.io/acme/checkout@sha256:9f2c4d1e8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d"],
        "service.name": "checkout-api",  # the resource.opentelemetry.io annotation beats the app.kubernetes.io/name label
        "service.version": "1.4.2",  # app.kubernetes.io/version
        "service.namespace": "shop",
        "service.instance.id": "shop.checkout-6f7c9d8b4d-x2x9q.checkout",
        "deployment.environment.name": "production",  # any resource.opentelemetry.io/ annotation
        "app.label.component": "backend",
    }


def test_the_sidecar_gets_its_own_container_attributes_and_the_pods_service(cluster):
    with running(profiling_config(cluster)) as processor:
        [resource] = processor.resources(profile(**{"container.id": ENVOY_ID}))
    assert (resource["k8s.container.name"], resource["container.image.name"], resource["container.image.tag"]) == ("envoy", "docker.io/envoyproxy/envoy", "v1.30.1")
    assert resource["service.instance.id"] == "shop.checkout-6f7c9d8b4d-x2x9q.envoy"
    assert (resource["service.name"], resource["service.version"]) == ("checkout-api", "1.4.2")  # pod-level beats the image tag


def test_attributes_the_sender_set_are_never_overwritten_but_empty_ones_are_filled(cluster):
    with running(profiling_config(cluster)) as processor:
        [resource] = processor.resources(profile(**{"container.id": CHECKOUT_ID, "service.name": "set-by-sdk", "k8s.namespace.name": "", "service.version": 7}))
    assert (resource["service.name"], resource["k8s.namespace.name"], resource["service.version"]) == ("set-by-sdk", "shop", 7)


def test_an_unknown_container_passes_unchanged_and_counts_a_miss(cluster):
    with running(profiling_config(cluster)) as processor:
        [resource] = processor.resources(profile(**{"container.id": "f" * 64, "process.pid": 1}))
        [no_id] = processor.resources(profile(**{"process.pid": 2}))
        assert processor.metric("otelcol_otelsvc_k8s_ip_lookup_miss_total") == 1  # only a named pod can be missed
        assert processor.metric("otelcol_k8s_pod_association_total", status="error", otelcol_signal="profiles") == 2
    assert (resource, no_id) == ({"container.id": "f" * 64, "process.pid": 1}, {"process.pid": 2})


def _traces(attributes):
    return trace_pb2.TracesData(resource_spans=[{"resource": {"attributes": key_values(attributes)}, "scope_spans": [{"spans": [{"name": "s"}]}]}])


def _metrics(attributes):
    return metrics_pb2.MetricsData(resource_metrics=[{"resource": {"attributes": key_values(attributes)}}])


def _logs(attributes):
    return logs_pb2.LogsData(resource_logs=[{"resource": {"attributes": key_values(attributes)}}])


@pytest.mark.parametrize("build", [profile, _traces, _metrics, _logs], ids=["profiles", "traces", "metrics", "logs"])
def test_every_signal_is_enriched_by_pod_ip_without_association_rules(cluster, build):
    config = {"auth_type": "none", "endpoint": cluster.url, "wait_for_metadata": True}  # Go's default metadata list
    with running(config) as processor:
        [resource] = processor.resources(build(**{"k8s.pod.ip": "10.244.1.17"}) if build is profile else build({"k8s.pod.ip": "10.244.1.17"}))
    assert resource == {
        "k8s.pod.ip": "10.244.1.17",
        "k8s.pod.name": "checkout-6f7c9d8b4d-x2x9q",
        "k8s.pod.uid": "3c1e0f6a-6c2b-4a53-9d0e-2f6a1b7c8d90",
        "k8s.pod.start_time": "2025-03-04T09:12:31Z",
        "k8s.namespace.name": "shop",
        "k8s.node.name": "node-a",
        "k8s.deployment.name": "checkout",
    }


@pytest.mark.parametrize(
    "rules, attributes",
    [
        ([{"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]}], {"k8s.pod.uid": "3c1e0f6a-6c2b-4a53-9d0e-2f6a1b7c8d90"}),
        ([{"sources": [{"from": "resource_attribute", "name": "net.host.ip"}]}], {"net.host.ip": "10.244.1.17"}),
        ([{"sources": [{"from": "resource_attribute", "name": "k8s.pod.name"}, {"from": "resource_attribute", "name": "k8s.namespace.name"}]}],
         {"k8s.pod.name": "checkout-6f7c9d8b4d-x2x9q", "k8s.namespace.name": "shop"}),
        # The first rule whose attributes are all present decides: here the second.
        ([{"sources": [{"from": "connection"}]}, {"sources": [{"from": "resource_attribute", "name": "host.name"}]}], {"host.name": "10.244.1.17"}),
    ],
    ids=["pod-uid", "net-host-ip", "name-and-namespace", "connection-then-host-ip"],
)
def test_association_rules(cluster, rules, attributes):
    with running({"auth_type": "none", "endpoint": cluster.url, "wait_for_metadata": True, "pod_association": rules}) as processor:
        [resource] = processor.resources(profile(**attributes))
    assert resource["k8s.pod.name"] == "checkout-6f7c9d8b4d-x2x9q"


@pytest.mark.parametrize("rules", [[{"sources": [{"from": "connection"}]}], []], ids=["connection-rule", "no-rules"])
def test_the_sending_clients_address_finds_its_pod_and_is_written_down(cluster, rules):
    with running({"auth_type": "none", "endpoint": cluster.url, "wait_for_metadata": True, "pod_association": rules}) as processor:
        with client_context(ClientInfo("10.244.1.17")):
            [resource] = processor.resources(profile(**{"process.pid": 7}))
        [unknown] = processor.resources(profile(**{"process.pid": 8}))  # no client: no pod
    assert resource["k8s.pod.name"] == "checkout-6f7c9d8b4d-x2x9q" and resource["k8s.pod.ip"] == "10.244.1.17"
    assert unknown == {"process.pid": 8}


def test_passthrough_only_tags_the_clients_pod_ip_and_needs_no_api_server():
    # As an agent in Go's passthrough mode: the gateway behind it finds the pod by k8s.pod.ip.
    with running({"auth_type": "none", "endpoint": "https://127.0.0.1:9", "passthrough": True}) as processor:
        with client_context(ClientInfo("10.244.1.17")):
            [resource] = processor.resources(profile(**{"process.pid": 7}))
            [kept] = processor.resources(profile(**{"process.pid": 7, "k8s.pod.ip": "10.0.0.1"}))
    assert resource == {"process.pid": 7, "k8s.pod.ip": "10.244.1.17"}
    assert kept["k8s.pod.ip"] == "10.0.0.1"  # what the sender set stays


def test_namespace_and_node_labels_the_cluster_uid_and_key_regex_templates(cluster):
    extract = {
        "metadata": ["k8s.pod.name", "k8s.cluster.uid", "k8s.node.uid"],
        "labels": [
            {"key": "team", "from": "namespace"},
            {"tag_name": "zone", "key": "topology.kubernetes.io/zone", "from": "node"},
            {"tag_name": "app.$1", "key_regex": "app\\.kubernetes\\.io/(.*)"},
        ],
        "annotations": [{"key_regex": "owner", "from": "namespace"}],
    }
    with running({"auth_type": "none", "endpoint": cluster.url, "wait_for_metadata": True, "extract": extract}) as processor:
        [resource] = processor.resources(profile(**{"k8s.pod.ip": "10.244.1.17"}))
    assert resource == {
        "k8s.pod.ip": "10.244.1.17",
        "k8s.pod.name": "checkout-6f7c9d8b4d-x2x9q",
        "k8s.cluster.uid": "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",  # the kube-system namespace's uid
        "k8s.node.uid": "7c6b5a4f-3e2d-4c1b-a09f-8e7d6c5b4a3f",
        "k8s.namespace.labels.team": "payments",
        "k8s.namespace.annotations.owner": "payments@acme.example",
        "zone": "eu-west-1a",
        "app.name": "checkout",
        "app.version": "1.4.2",
        "app.component": "backend",
    }


# -- precedence, on the rules alone ------------------------------------------------------------

SERVICE = ["service.name", "service.version", "k8s.deployment.name"]
CHECKOUT_RS = ReplicaSetRecord("b5e2a9d1-0c44-4d2e-8f3b-6a7e9c1d2f03", "checkout-6f7c9d8b4d", "checkout", "e8d1c2b3-4a5f-4e6d-9c7b-8a9f0e1d2c3b")


def _bare_pod(**meta):
    pod = copy.deepcopy(POD)
    pod["metadata"]["labels"], pod["metadata"]["annotations"] = {}, {}
    pod["metadata"].update(meta)
    return pod


@pytest.mark.parametrize(
    "pod, replicasets, expected",
    [
        (_bare_pod(), {}, {"service.name": "checkout-6f7c9d8b4d"}),  # ReplicaSet not known (yet)
        (_bare_pod(), {CHECKOUT_RS.uid: CHECKOUT_RS}, {"service.name": "checkout", "k8s.deployment.name": "checkout"}),
        (_bare_pod(labels={"app.kubernetes.io/name": "shop-checkout"}), {CHECKOUT_RS.uid: CHECKOUT_RS}, {"service.name": "shop-checkout", "k8s.deployment.name": "checkout"}),
        (_bare_pod(labels={"app.kubernetes.io/name": "n", "app.kubernetes.io/instance": "i", "app.kubernetes.io/version": "2"}), {}, {"service.name": "i", "service.version": "2"}),
        (_bare_pod(ownerReferences=[{"kind": "Job", "name": "nightly-report-28975560", "uid": "j1", "controller": True}]), {}, {"service.name": "nightly-report"}),
        (_bare_pod(ownerReferences=[{"kind": "StatefulSet", "name": "db", "uid": "s1", "controller": True}]), {}, {"service.name": "db"}),
        (_bare_pod(ownerReferences=[]), {}, {"service.name": "checkout-6f7c9d8b4d-x2x9q"}),
        (_bare_pod(annotations={"resource.opentelemetry.io/service.version": "9"}, labels={"app.kubernetes.io/version": "2"}), {}, {"service.name": "checkout-6f7c9d8b4d", "service.version": "9"}),
    ],
    ids=["replicaset", "deployment", "name-label", "instance-label", "cronjob", "statefulset", "bare-pod", "annotation-version"],
)
def test_service_name_and_version_precedence(pod, replicasets, expected):
    rules = ExtractionRules(ExtractConfig(metadata=SERVICE, otel_annotations=True), [])
    assert rules.pod(pod, replicasets).attributes == expected


def test_the_image_gives_service_version_when_labels_and_annotations_do_not():
    rules = ExtractionRules(ExtractConfig(metadata=["service.version", "container.image.tag"]), [])
    containers = rules.pod(_bare_pod(), {}).containers_by_name
    assert containers["envoy"].attributes == {"service.version": "v1.30.1", "container.image.tag": "v1.30.1"}


@pytest.mark.parametrize("excluded, annotations", [(["^checkout-"], {}), ([], {"opentelemetry.io/k8s-processor/ignore": "true"})], ids=["exclude", "annotation"])
def test_excluded_and_ignored_pods_are_never_matched(excluded, annotations):
    rules = ExtractionRules(ExtractConfig(), excluded)
    pod = rules.pod(_bare_pod(annotations=annotations), {})
    assert pod.ignored and pod.attributes == {}
