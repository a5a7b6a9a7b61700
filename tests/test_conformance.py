"""Every installed component, built-in or third-party, keeps the component contract.

Parametrized over the entry points actually installed, so a new plugin is covered the moment it is
installed, with no change here.
"""

import pytest

from pycollector.component import KINDS
from pycollector.registry import Registry
from pycollector.testing import assert_conformance

# Components whose start needs more than a config: the kernel (marked), or a place to write.
NEEDS_BPF = {("receivers", "profiling")}
CONFIG_FOR_TEST = {
    ("exporters", "sample_counts"): lambda tmp_path: {"path": str(tmp_path / "counts.csv")},
    ("receivers", "profiling"): lambda tmp_path: {"reporter_interval": "200ms"},
    ("processors", "k8s_attributes"): lambda tmp_path: {"auth_type": "none", "endpoint": "https://127.0.0.1:1", "wait_for_metadata": False},
    ("processors", "k8sattributes"): lambda tmp_path: {"auth_type": "none", "endpoint": "https://127.0.0.1:1", "wait_for_metadata": False},
    ("exporters", "pprof"): lambda tmp_path: {"directory": str(tmp_path / "pprof")},
    ("exporters", "file"): lambda tmp_path: {"path": str(tmp_path / "out.jsonl")},
    ("exporters", "flamegraph"): lambda tmp_path: {"endpoint": "localhost:0"},
    ("extensions", "health_check"): lambda tmp_path: {"endpoint": "localhost:0"},
    ("extensions", "pprof"): lambda tmp_path: {"endpoint": "localhost:0"},
    ("exporters", "load_balancing"): lambda tmp_path: {"resolver": {"static": {"hostnames": ["127.0.0.1:1"]}}, "protocol": {"otlp": {"tls": {"insecure": True}}}},
    ("exporters", "loadbalancing"): lambda tmp_path: {"resolver": {"static": {"hostnames": ["127.0.0.1:1"]}}, "protocol": {"otlp": {"tls": {"insecure": True}}}},
    ("extensions", "bearertokenauth"): lambda tmp_path: {"token": "a-token"},
    ("extensions", "basicauth"): lambda tmp_path: {"htpasswd": {"inline": "user:password"}},
    ("extensions", "file_storage"): lambda tmp_path: {"directory": str(tmp_path / "storage"), "create_directory": True},
    ("receivers", "otlp"): lambda tmp_path: {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}},
}


def installed_plugins():
    registry = Registry()
    for kind in KINDS:
        for info in registry.plugins(kind):
            marks = [pytest.mark.bpf] if (kind, info.name) in NEEDS_BPF else []
            yield pytest.param(kind, info.name, id=f"{kind}::{info.name}", marks=marks)


@pytest.mark.parametrize("kind, name", list(installed_plugins()))
def test_installed_component_keeps_the_contract(kind, name, tmp_path):
    factory = Registry().load(kind, name).factory
    config = CONFIG_FOR_TEST.get((kind, name), lambda _: {})(tmp_path)
    assert_conformance(factory, kind, config)


def test_the_example_third_party_plugin_is_discovered_from_its_own_distribution():
    [info] = [info for info in Registry().plugins("exporters") if info.name == "sample_counts"]
    assert info.distribution.startswith("pycollector-example-exporter ")
