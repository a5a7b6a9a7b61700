"""The resource detection processor (issue 28): Go's env, system and k8s_api detectors, what they
find on this host and in a (fake, real wire format) Kubernetes API, how detected attributes meet
the data's, and what Go's config has that is refused here by name."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pycollector.component import StartError
from pycollector.pdata.attributes import key_values, to_dict
from pycollector.testing import CapturingConsumer, TestHost, assert_conformance, make_settings
from opentelemetry.proto.profiles.v1development import profiles_pb2

from processors.resourcedetection.config import ResourceDetectionConfig
from processors.resourcedetection.detectors import DetectionError, detect_env
from processors.resourcedetection.factory import factory
from processors.resourcedetection.processor import ResourceDetectionProcessor
from tests.test_processors_support import problems_of
from tests.test_k8sattributes_auth import write_kubeconfig
from tests.test_k8sattributes_fake_api import FakeKubeApi


def run(config: dict, environ: dict[str, str], resource: dict | None = None) -> dict:
    """Start the processor on ``config`` with ``environ``, pass one profiles message with ``resource``; the resource that came out."""
    downstream = CapturingConsumer()
    processor = ResourceDetectionProcessor(make_settings("processors", "resource_detection"), ResourceDetectionConfig.model_validate(config),
                                           downstream, environ=environ)
    processor.start(TestHost())
    try:
        data = profiles_pb2.ProfilesData(resource_profiles=[{"resource": {"attributes": key_values(resource or {})}}])
        processor.consume(data)
    finally:
        processor.shutdown()
    return to_dict(downstream.messages[0].resource_profiles[0].resource.attributes)


def test_keeps_the_contract():
    assert_conformance(factory, "processors", {"detectors": ["env"]})


def test_env_reads_otel_resource_attributes_as_go_does():
    assert detect_env({"OTEL_RESOURCE_ATTRIBUTES": " service.version = 1.4 , team=a%2Cb+c, empty="}) == {
        "service.version": "1.4", "team": "a,b c", "empty": ""}
    assert detect_env({"OTEL_RESOURCE": "deployment.environment=prod"}) == {"deployment.environment": "prod"}  # (the older name)
    assert detect_env({}) == {}
    for bad in ("a=b,c", "a=%zz", "=b"):
        with pytest.raises(DetectionError, match="invalid resource format"):
            detect_env({"OTEL_RESOURCE_ATTRIBUTES": bad})


def test_system_gives_host_name_and_os_type_and_what_else_is_switched_on():
    resource = run({"detectors": ["system"], "system": {"hostname_sources": ["os"], "resource_attributes": {"host.id": {"enabled": True}, "host.arch": {"enabled": True}}}}, {})
    assert resource["host.name"] == socket.gethostname() and resource["os.type"] == "linux"
    machine_id = Path("/etc/machine-id")
    if machine_id.exists() and machine_id.read_text().strip():
        assert resource["host.id"] == machine_id.read_text().strip()
    assert resource["host.arch"] in ("amd64", "arm64")
    assert "os.description" not in resource  # (off by default, as in Go)
    switched_off = run({"detectors": ["system"], "system": {"resource_attributes": {"os.type": {"enabled": False}}}}, {})
    assert "os.type" not in switched_off and "host.name" in switched_off


def test_the_first_detector_wins_and_override_decides_against_the_datas_own():
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "host.name=from-env,team=profiling"}
    resource = run({"detectors": ["env", "system"]}, environ, {"team": "mine", "service.name": "shop"})
    assert resource["host.name"] == "from-env" and resource["team"] == "profiling" and resource["service.name"] == "shop"
    kept = run({"detectors": ["env"], "override": False}, environ, {"team": "mine"})
    assert kept["team"] == "mine" and kept["host.name"] == "from-env"


def test_a_detector_that_keeps_failing_stops_the_start_naming_why():
    processor = ResourceDetectionProcessor(make_settings("processors", "resource_detection"),
                                           ResourceDetectionConfig.model_validate({"detectors": ["env"], "timeout": "1s"}), CapturingConsumer(),
                                           environ={"OTEL_RESOURCE_ATTRIBUTES": "broken"})
    with pytest.raises(StartError, match="resource detection failed: env: invalid resource format"):
        processor.start(TestHost())


def test_k8s_api_gives_the_node_and_cluster_uids_from_the_api_server(tmp_path, monkeypatch):
    with FakeKubeApi(token="secret") as api:
        api.put("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-7", "uid": "9a8b-node"}})
        api.put("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system", "uid": "c1u5-cluster"}})
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", api.url, token="secret")))
        resource = run({"detectors": ["k8s_api"], "k8s_api": {"auth_type": "kubeConfig", "node_from_env_var": "MY_NODE"}}, {"MY_NODE": "node-7"})
        assert {key: resource[key] for key in ("k8s.node.name", "k8s.node.uid", "k8s.cluster.uid")} == {
            "k8s.node.name": "node-7", "k8s.node.uid": "9a8b-node", "k8s.cluster.uid": "c1u5-cluster"}
        # k8snode, the older name, reads its own section.
        older = run({"detectors": ["k8snode"], "k8snode": {"auth_type": "kubeConfig", "resource_attributes": {"k8s.cluster.uid": {"enabled": False}}}},
                    {"K8S_NODE_NAME": "node-7"})
        assert older["k8s.node.uid"] == "9a8b-node" and "k8s.cluster.uid" not in older
    processor = ResourceDetectionProcessor(make_settings("processors", "resource_detection"),
                                           ResourceDetectionConfig.model_validate({"detectors": ["k8s_api"], "timeout": "1s"}), CapturingConsumer(), environ={})
    with pytest.raises(StartError, match="environment variable K8S_NODE_NAME is not set"):
        processor.start(TestHost())


@pytest.mark.parametrize("config, problem", [
    ({"detectors": ["ec2"]}, "processors::resource_detection::detectors: detector 'ec2' is not supported by pycollector"),
    ({"detectors": ["nosuch"]}, "processors::resource_detection::detectors: detector 'nosuch' is not supported by pycollector (no such detector)"),
    ({"gcp": {}}, "processors::resource_detection::gcp: not supported by pycollector"),
    ({"endpoint": "http://x"}, "processors::resource_detection::endpoint: not supported by pycollector"),
    ({"system": {"hostname_sources": ["dns", "ldap"]}}, "processors::resource_detection::system::hostname_sources::1"),
    ({"system": {"resource_attributes": {"host.ip": {"enabled": True}}}}, "processors::resource_detection::system: resource_attributes::host.ip: not supported"),
    ({"system": {"resource_attributes": {"host.nonsense": {"enabled": True}}}}, "processors::resource_detection::system::resource_attributes::host.nonsense: unknown key"),
])
def test_what_is_not_here_is_refused_by_name(config, problem):
    problems = problems_of("processors", "resource_detection", config)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


@pytest.mark.bpf
def test_the_agent_config_puts_host_os_and_the_environments_attributes_on_every_profile(tmp_path, monkeypatch):
    """deploy/systemd/config.yaml as the unit runs it (its processors), sending to a file instead of
    Pyroscope, OTEL_RESOURCE_ATTRIBUTES set as /etc/default/pycollector would set it."""
    import subprocess
    import sys
    import time

    from pycollector.config import load
    from pycollector.config.validate import build_plan
    from pycollector.pdata import iter_samples
    from pycollector.registry import Registry
    from pycollector.service import Service

    from tests.conftest import REPO

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=profiling")
    config = load([str(REPO / "deploy" / "systemd" / "config.yaml")], env={})
    assert config["service"]["pipelines"]["profiles"]["processors"][1] == "resource_detection"
    config["receivers"]["profiling"].update(reporter_interval="1s", unwind_cache_dir=str(tmp_path / "unwind"))
    config["exporters"] = {"file": {"path": str(tmp_path / "profiles.jsonl"), "flush_interval": "200ms"}}
    config["extensions"] = {"health_check": {"endpoint": "127.0.0.1:0"}}
    config["service"].update(extensions=["health_check"], telemetry={"metrics": {"level": "none"}})
    config["service"]["pipelines"]["profiles"]["exporters"] = ["file"]
    config["processors"]["batch"] = {"timeout": "200ms"}
    service = Service(build_plan(config, Registry()))
    service.start()
    try:
        spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
        workloads = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
        for workload in workloads:
            workload.wait()
        time.sleep(1.5)  # their last report
    finally:
        service.shutdown()
    from opentelemetry.proto.profiles.v1development.profiles_pb2 import ProfilesData

    from pycollector.otlp.profiles_wire.codec import decode

    resources = []
    for line in (tmp_path / "profiles.jsonl").read_bytes().splitlines():
        data = decode(line, "json", ProfilesData).message
        resources.extend({view.resource.get("process.pid"): view.resource for view in iter_samples(data)}.values())
    assert len(resources) >= 2, resources  # (the two workloads at least)
    for resource in resources:
        assert resource["host.name"] and resource["os.type"] == "linux", resource
        assert resource["deployment.environment"] == "test" and resource["team"] == "profiling", resource
