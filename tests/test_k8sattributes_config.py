"""Keys and defaults as the Go k8sattributes processor's, every mistake named with its key, the
component contract, and the eBPF profiling DaemonSet config validating as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycollector.config import ConfigError, load
from pycollector.config.validate import build_plan
from pycollector.registry import Registry
from pycollector.testing import assert_conformance

from processors.k8sattributes.config import K8sAttributesConfig
from processors.k8sattributes.factory import factory

DAEMONSET = Path(__file__).parent / "testdata" / "k8s" / "daemonset-profiling.yaml"
# What tests/test_conformance.py needs: no cluster, an address nothing listens on, no waiting.
CONFORMANCE_CONFIG = {"auth_type": "none", "endpoint": "https://127.0.0.1:1", "wait_for_metadata": False}


def test_defaults_are_the_go_processors():
    config = K8sAttributesConfig()
    assert (config.auth_type, config.passthrough, config.wait_for_metadata, config.wait_for_metadata_timeout) == ("serviceAccount", False, False, 10.0)
    assert config.extract.metadata == [
        "container.image.name", "container.image.tag", "k8s.deployment.name", "k8s.namespace.name",
        "k8s.node.name", "k8s.pod.name", "k8s.pod.start_time", "k8s.pod.uid",
    ]
    assert [pod.name for pod in config.exclude.pods] == ["jaeger-agent", "jaeger-collector"]
    assert (config.pod_association, config.extract.otel_annotations) == ([], False)


def test_the_processor_keeps_the_component_contract_without_a_cluster():
    assert_conformance(factory, "processors", CONFORMANCE_CONFIG)


def _plan(processor_config: dict):
    return build_plan(
        {
            "receivers": {"otlp": {"protocols": {"grpc": None}}},
            "processors": {"k8sattributes": processor_config},
            "exporters": {"debug": {}},
            "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["k8sattributes"], "exporters": ["debug"]}}},
        },
        Registry(),
    )


@pytest.mark.parametrize(
    "config, message",
    [
        ({"auth_type": "tls"}, "processors::k8sattributes::auth_type"),
        ({"extract": {"metadata": ["k8s.pod.labels"]}}, "'k8s.pod.labels' is not a supported metadata field"),
        ({"extract": {"labels": [{"key": "a", "key_regex": "b"}]}}, "give key or key_regex, not both"),
        ({"extract": {"annotations": [{"key_regex": "("}]}}, "key_regex '(' is not a valid regular expression"),
        ({"extract": {"labels": [{"key": "a", "from": "cronjob"}]}}, "processors::k8sattributes::extract::labels::0::from"),
        ({"pod_association": [{"sources": [{"from": "resource_attribute", "name": n} for n in "abcde"]}]}, "at most 4 items"),
        ({"pod_association": [{"sources": [{"from": "resource_attribute"}]}]}, "needs the attribute's name"),
        ({"filter": {"fields": [{"key": "status.phase", "value": "Running", "op": "exists"}]}}, "not supported for field filters"),
        ({"wait_for_metadata_timeout": 10.5}, "needs a unit"),
        ({"endpoint": "127.0.0.1:6443"}, "must be a URL"),
    ],
)
def test_mistakes_are_named_with_their_key(config, message):
    with pytest.raises(ConfigError) as error:
        _plan(config)
    assert message in str(error.value)


def test_the_old_name_k8sattributes_still_works_as_a_deprecated_alias():
    # The Go collector renamed k8sattributes to k8s_attributes in v0.146.0.
    plan = build_plan(
        {
            "receivers": {"otlp": {"protocols": {"grpc": None}}},
            "processors": {"k8sattributes": {"passthrough": True}},
            "exporters": {"debug": {}},
            "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["k8sattributes"], "exporters": ["debug"]}}},
        },
        Registry(),
    )
    assert plan.component("processors", "k8sattributes").factory.type == "k8s_attributes"
    assert plan.aliases_used == [("processors::k8sattributes", "k8sattributes", "k8s_attributes")]


def test_the_ebpf_profiling_daemonset_config_validates(monkeypatch):
    monkeypatch.setenv("KUBE_NODE_NAME", "node-a")
    config = build_plan(load([str(DAEMONSET)]), Registry()).component("processors", "k8sattributes").config
    assert (config.filter.node_name(), config.extract.otel_annotations, config.wait_for_metadata) == ("node-a", True, True)
    assert [[(getattr(s, "from"), s.name) for s in rule.sources] for rule in config.pod_association] == [[("resource_attribute", "container.id")]]
    # Validated where the variable is not set (outside the pod), it is named, as Go's Validate names it.
    monkeypatch.delenv("KUBE_NODE_NAME")
    with pytest.raises(ConfigError, match="processors::k8sattributes::filter::node_from_env_var: environment variable KUBE_NODE_NAME is not set"):
        build_plan(load([str(DAEMONSET)]), Registry())
