"""The eBPF profiling DaemonSet config, run in-process: a service-account pod on node-a, its
profiles enriched on their way to the exporter. Only the receiver and exporter are swapped for
in-test components (the profiling receiver needs the kernel); the k8sattributes section is the
file's, with the API server address added."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycollector.config import load
from pycollector.config.validate import build_plan
from pycollector.pdata import to_dict
from pycollector.service import Service
from pycollector.testing import receiver_of, registry_with

from pycollector.kubernetes import access as auth
from tests.components import Journal, factories
from tests.test_k8sattributes_fake_api import FakeKubeApi, checkout_cluster, container_id, fixture, profile

DAEMONSET = Path(__file__).parent / "testdata" / "k8s" / "daemonset-profiling.yaml"


@pytest.fixture
def in_a_pod_on_node_a(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("daemonset-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(auth, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    monkeypatch.setenv("KUBE_NODE_NAME", "node-a")


def test_the_daemonset_config_enriches_profiles_in_a_running_pipeline(in_a_pod_on_node_a):
    journal = Journal()
    with FakeKubeApi(token="daemonset-token") as api:
        checkout_cluster(api)
        config = load([str(DAEMONSET)], sets=[f"processors::k8sattributes::endpoint={api.url}"])
        config["receivers"] = {"recorder": {}}
        config["exporters"] = {"keeper": {}}
        config["service"]["pipelines"]["profiles"].update(receivers=["recorder"], exporters=["keeper"])
        config["service"]["telemetry"] = {"metrics": {"level": "none"}}
        service = Service(build_plan(config, registry_with(**factories(journal))))
        service.start()  # wait_for_metadata: true, so the pod table is filled once this returns
        try:
            recorder = receiver_of(service)
            recorder.push(profile(**{"container.id": container_id(fixture("pod-checkout.json"), "checkout"), "process.pid": 31337}))
        finally:
            service.shutdown()
        assert {params.get("fieldSelector") for params in api.requested("pods")} == {"spec.nodeName=node-a"}
    [received] = journal.received["keeper"]
    resource = to_dict(received.resource_profiles[0].resource.attributes)
    assert {key: resource[key] for key in ("k8s.pod.name", "k8s.deployment.name", "k8s.container.name", "service.name", "app.label.component")} == {
        "k8s.pod.name": "checkout-6f7c9d8b4d-x2x9q",
        "k8s.deployment.name": "checkout",
        "k8s.container.name": "checkout",
        "service.name": "checkout-api",
        "app.label.component": "backend",
    }
