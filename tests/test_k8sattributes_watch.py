"""The pod table follows the cluster through the watch: adds, updates and deletes without a
restart; 410 Gone makes it list again; an API server that is down fails start only when told to
wait for metadata, and otherwise lets data through unenriched."""

from __future__ import annotations

import copy
import socket
import time

import pytest

from pycollector.component import StartError

from tests.test_k8sattributes_fake_api import (
    BY_CONTAINER_ID,
    PROFILING_METADATA,
    FakeKubeApi,
    checkout_cluster,
    container_id,
    eventually,
    fixture,
    profile,
    running,
)

POD = fixture("pod-checkout.json")
CHECKOUT_ID = container_id(POD, "checkout")


def config_for(url: str, **overrides) -> dict:
    config = {
        "auth_type": "none",
        "endpoint": url,
        "wait_for_metadata": True,
        "wait_for_metadata_timeout": "5s",
        "pod_delete_grace_period": "0s",  # (deletes take effect at once; the grace has its own test)
        "extract": {"metadata": PROFILING_METADATA},
        "pod_association": BY_CONTAINER_ID,
    }
    return {**config, **overrides}


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def pod_name_for(processor, container: str) -> str | None:
    [resource] = processor.resources(profile(**{"container.id": container}))
    return resource.get("k8s.pod.name")


def test_a_pod_added_updated_and_deleted_through_the_watch_is_followed_without_restart():
    with FakeKubeApi() as api:
        api.put("replicasets", fixture("replicaset-checkout.json"))
        with running(config_for(api.url)) as processor:
            assert pod_name_for(processor, CHECKOUT_ID) is None

            api.put("pods", POD)
            eventually(lambda: pod_name_for(processor, CHECKOUT_ID) == "checkout-6f7c9d8b4d-x2x9q")

            # The checkout container restarts: the pod is MODIFIED with a new container id.
            restarted = copy.deepcopy(POD)
            status = restarted["status"]["containerStatuses"][0]
            status["restartCount"], status["containerID"] = 1, "containerd://" + "a1" * 32
            api.put("pods", restarted)
            eventually(lambda: pod_name_for(processor, "a1" * 32) == "checkout-6f7c9d8b4d-x2x9q")
            assert pod_name_for(processor, CHECKOUT_ID) is None

            api.delete("pods", restarted)
            eventually(lambda: pod_name_for(processor, "a1" * 32) is None)
            counts = [processor.metric(f"otelcol_otelsvc_k8s_pod_{event}_total") for event in ("added", "updated", "deleted")]
            assert counts == [1, 1, 1]
            assert processor.metric("otelcol_otelsvc_k8s_pod_table_size") == 0


def test_a_replicaset_seen_after_its_pod_still_names_the_deployment():
    with FakeKubeApi() as api:
        api.put("pods", POD)
        with running(config_for(api.url)) as processor:
            [before] = processor.resources(profile(**{"container.id": CHECKOUT_ID}))
            api.put("replicasets", fixture("replicaset-checkout.json"))
            eventually(lambda: processor.resources(profile(**{"container.id": CHECKOUT_ID}))[0].get("k8s.deployment.name") == "checkout")
    assert "k8s.deployment.name" not in before


@pytest.mark.parametrize("gone_as", ["http", "event"])
def test_gone_makes_the_watcher_list_again_and_drop_what_vanished(gone_as):
    with FakeKubeApi(gone_as=gone_as) as api:
        checkout_cluster(api)
        with running(config_for(api.url)) as processor:
            assert pod_name_for(processor, CHECKOUT_ID) == "checkout-6f7c9d8b4d-x2x9q"
            # The checkout pod goes and another comes, and history is compacted before the
            # watcher hears of it: only a new list can tell.
            other = copy.deepcopy(POD)
            other["metadata"].update(name="checkout-6f7c9d8b4d-k7m2p", uid="9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a")
            other["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "b2" * 32
            api.delete("pods", POD, missed=True)
            api.put("pods", other, missed=True)
            api.expire("pods")
            eventually(lambda: pod_name_for(processor, "b2" * 32) == "checkout-6f7c9d8b4d-k7m2p")
            assert pod_name_for(processor, CHECKOUT_ID) is None
            lists = [params for params in api.requested("pods") if "watch" not in params]
            assert len(lists) == 2
            assert processor.metric("otelcol_otelsvc_k8s_pod_deleted_total") == 1


def test_a_restarted_api_server_is_reconnected_to_and_the_watch_resumed():
    with FakeKubeApi() as first:
        checkout_cluster(first)
        url = first.url
        with running(config_for(url)) as processor:
            first.stop()
            # The same cluster state behind a new API server process, one change further on.
            with FakeKubeApi(port=int(url.rsplit(":", 1)[1]), first_revision=first.revision) as second:
                restarted = copy.deepcopy(POD)
                restarted["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "c3" * 32
                second.put("pods", restarted)
                eventually(lambda: pod_name_for(processor, "c3" * 32) == "checkout-6f7c9d8b4d-x2x9q", timeout=10)
            lists = [params for params in second.requested("pods") if "watch" not in params]
            assert not lists  # resumed from the last resourceVersion, not listed again


def test_api_server_down_with_wait_for_metadata_fails_start_after_the_timeout():
    url = closed_port_url()
    began = time.monotonic()
    with pytest.raises(StartError) as failure:
        with running(config_for(url, wait_for_metadata_timeout="1s")):
            pass
    assert 1.0 <= time.monotonic() - began < 4.0
    message = str(failure.value)
    assert "did not sync within 1s" in message and url in message and "pods:" in message and "Connection refused" in message


def test_api_server_down_without_waiting_passes_data_unenriched_and_counts_the_miss():
    with running(config_for(closed_port_url(), wait_for_metadata=False)) as processor:
        [resource] = processor.resources(profile(**{"container.id": CHECKOUT_ID, "process.pid": 9}))
        assert resource == {"container.id": CHECKOUT_ID, "process.pid": 9}
        assert processor.metric("otelcol_otelsvc_k8s_ip_lookup_miss_total") == 1
        assert processor.metric("otelcol_k8s_pod_association_total", status="error", otelcol_signal="profiles") == 1


def test_only_this_nodes_pods_are_watched_and_other_collections_only_when_needed(monkeypatch):
    monkeypatch.setenv("KUBE_NODE_NAME", "node-a")
    with FakeKubeApi() as api:
        checkout_cluster(api)
        config = config_for(api.url, filter={"node_from_env_var": "KUBE_NODE_NAME"})
        with running(config):
            pass
        assert {params.get("fieldSelector") for params in api.requested("pods")} == {"spec.nodeName=node-a"}
        assert api.requested("replicasets") and not api.requested("namespaces") and not api.requested("nodes")

        api.requests.clear()
        with running(config_for(api.url, extract={"metadata": ["k8s.pod.name"]})):
            pass
        assert api.requested("pods") and not api.requested("replicasets")

        api.requests.clear()
        extract = {"metadata": ["k8s.pod.name", "k8s.cluster.uid"], "labels": [{"key": "zone", "from": "node"}]}
        with running(config_for(api.url, filter={"node": "node-a"}, extract=extract)):
            pass
        assert {params.get("fieldSelector") for params in api.requested("namespaces")} == {"metadata.name=kube-system"}
        assert {params.get("fieldSelector") for params in api.requested("nodes")} == {"metadata.name=node-a"}


def test_shutdown_ends_open_watches_at_once():
    with FakeKubeApi() as api:
        checkout_cluster(api)
        with running(config_for(api.url)) as processor:
            eventually(lambda: any("watch" in params for params in api.requested("pods")))
            began = time.monotonic()
            processor.processor.shutdown()
            assert time.monotonic() - began < 0.5


def test_a_deleted_pod_still_enriches_during_its_grace_period():
    """As Go keeps a deleted pod for pod_delete_grace_period: what it sent before it went is still
    named after its deletion arrives."""
    with FakeKubeApi() as api:
        api.put("replicasets", fixture("replicaset-checkout.json"))
        api.put("pods", POD)
        with running(config_for(api.url, pod_delete_grace_period="1500ms")) as processor:
            assert pod_name_for(processor, CHECKOUT_ID) == "checkout-6f7c9d8b4d-x2x9q"
            api.delete("pods", POD)
            eventually(lambda: processor.metric("otelcol_otelsvc_k8s_pod_deleted_total") == 1)
            assert pod_name_for(processor, CHECKOUT_ID) == "checkout-6f7c9d8b4d-x2x9q"
            eventually(lambda: pod_name_for(processor, CHECKOUT_ID) is None)
            assert processor.metric("otelcol_otelsvc_k8s_pod_table_size") == 0


def workload(kind: str, api_version: str, name: str, uid: str, labels: dict, owner: dict | None = None) -> dict:
    """A workload object as the API server sends it (the fields the processor reads)."""
    meta = {"name": name, "namespace": "shop", "uid": uid, "labels": labels, "annotations": {"owner-team": "payments"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"], "uid": owner["uid"], "controller": True}]
    return {"kind": kind, "apiVersion": api_version, "metadata": meta, "spec": {}}


def test_labels_and_annotations_come_from_the_pods_workloads_as_go_reads_them():
    """`from: deployment` (through the pod's ReplicaSet), `from: replicaset`, `from: job`, and a
    Job's CronJob uid (k8s.cronjob.uid), each from its own collection the processor watches."""
    deployment = workload("Deployment", "apps/v1", "checkout", "e8d1c2b3-4a5f-4e6d-9c7b-8a9f0e1d2c3b", {"tier": "frontend"})
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "c0c0c0c0-0000-4000-8000-000000000001"}
    job = workload("Job", "batch/v1", "nightly-29012345", "10b10b10-0000-4000-8000-000000000002", {"tier": "batch"}, cronjob)
    job_pod = copy.deepcopy(POD)
    job_pod["metadata"].update(name="nightly-29012345-abcde", uid="20c20c20-0000-4000-8000-000000000003",
                               ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"], "controller": True}])
    job_pod["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "c3" * 32
    extract = {"metadata": [*PROFILING_METADATA, "k8s.cronjob.uid"],
               "labels": [{"from": "deployment", "key": "tier"}, {"from": "replicaset", "key": "pod-template-hash", "tag_name": "rs.hash"},
                          {"from": "job", "key": "tier", "tag_name": "job.tier"}],
               "annotations": [{"from": "deployment", "key": "owner-team"}]}
    with FakeKubeApi() as api:
        api.put("replicasets", fixture("replicaset-checkout.json"))
        api.put("deployments", deployment)
        api.put("jobs", job)
        api.put("pods", POD)
        api.put("pods", job_pod)
        with running(config_for(api.url, extract=extract)) as processor:
            [checkout] = processor.resources(profile(**{"container.id": CHECKOUT_ID}))
            assert checkout["k8s.deployment.labels.tier"] == "frontend" and checkout["k8s.deployment.annotations.owner-team"] == "payments"
            assert checkout["rs.hash"] == "6f7c9d8b4d"
            [nightly] = processor.resources(profile(**{"container.id": "c3" * 32}))
            assert nightly["job.tier"] == "batch" and nightly["k8s.cronjob.uid"] == cronjob["uid"]
            assert "k8s.deployment.labels.tier" not in nightly
            watched = {path for path, _ in api.requests}
            assert {"/apis/apps/v1/deployments", "/apis/batch/v1/jobs", "/apis/apps/v1/replicasets"} <= watched
            assert "/apis/apps/v1/statefulsets" not in watched  # (nothing reads from StatefulSets)
