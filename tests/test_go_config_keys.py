"""Every key the Go collector's config accepts for a component we share with it is accepted here
(and acts), or refused by name (`<path>: not supported by pycollector: <why>`), never accepted
and ignored, never an unknown key (issue 28). The key lists are written down from the Go structs,
each with its Go release, in tests/testdata/go_config/.

Each key is set alone (its Go default when it has one, else a plain value of its type) on top of
the least config the component needs, and validated as a user's config is."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml

from tests.test_processors_support import problems_of

GO_CONFIG = Path(__file__).parent / "testdata" / "go_config"

# (file, our section and type, what the component needs besides the key under test)
COMPONENTS = {
    "receivers_nop": ("receivers", "nop", {}),
    "exporters_nop": ("exporters", "nop", {}),
    "connectors_forward": ("connectors", "forward", {}),
    "exporters_debug": ("exporters", "debug", {}),
    "processors_batch": ("processors", "batch", {}),
    "processors_memory_limiter": ("processors", "memory_limiter", {"check_interval": "1s", "limit_mib": 100}),
    "processors_resource": ("processors", "resource", {"attributes": [{"key": "a", "value": "b", "action": "upsert"}]}),
    "exporters_file": ("exporters", "file", {"path": "/tmp/pycollector-go-keys.json"}),
    "extensions_pprof": ("extensions", "pprof", {}),
    "receivers_otlp": ("receivers", "otlp", {}),
    "exporters_otlp": ("exporters", "otlp_grpc", {"endpoint": "backend:4317"}),
    "exporters_otlphttp": ("exporters", "otlp_http", {"endpoint": "http://backend:4318"}),
    "processors_attributes": ("processors", "attributes", {"actions": [{"key": "a", "value": "b", "action": "upsert"}]}),
    "extensions_file_storage": ("extensions", "file_storage", {"directory": "/tmp"}),
    "processors_k8sattributes": ("processors", "k8s_attributes", {}),
    "processors_resourcedetection": ("processors", "resource_detection", {}),
    "extensions_health_check": ("extensions", "health_check", {}),
}
# What a section needs beside any of its keys, as in Go (a matcher needs its match_type).
SECTION_NEEDS = {
    ("processors_attributes", "include"): {"include": {"match_type": "strict", "resources": [{"key": "service.name"}]}},
    ("processors_attributes", "exclude"): {"exclude": {"match_type": "strict", "resources": [{"key": "service.name"}]}},
}

# Examples for keys whose Go default is no example, or which Go takes only with another key:
# the config fragment to set instead of the key alone.
EXAMPLES = {
    "exporters_debug:output_paths": {"use_internal_logger": False, "output_paths": ["stderr"]},
    "processors_memory_limiter:check_interval": {"check_interval": "2s"},
    "processors_resource:attributes": {"attributes": [{"key": "k", "value": "v", "action": "insert"}]},
    "exporters_file:directory_permissions": {"create_directory": True, "directory_permissions": "0750"},
    "exporters_file:encoding": {"encoding": "otlp_encoding"},
    "exporters_file:group_by::enabled": {"group_by": {"enabled": True, "resource_attribute": "service.name"}, "path": "/tmp/pycollector-go-keys-*.json"},
    "receivers_otlp:protocols": {"protocols": {"grpc": None}},
    "exporters_otlp:endpoint": {"endpoint": "backend:4317"},
    "exporters_otlp:tls::insecure_skip_verify": {"tls": {"insecure_skip_verify": False}},
    **{f"exporters_otlphttp:{key}": {key: "https://backend:4318/v1/x"} for key in ("endpoint", "traces_endpoint", "metrics_endpoint", "logs_endpoint", "profiles_endpoint")},
    "exporters_otlphttp:proxy_url": {"proxy_url": "http://proxy.internal:3128"},
    "processors_attributes:actions": {"actions": [{"key": "k", "pattern": "^tmp_", "action": "delete"}]},
    **{f"processors_attributes:{block}::resources": {block: {"match_type": "strict", "resources": [{"key": "k8s.pod.name"}]}}
       for block in ("include", "exclude")},
    "extensions_file_storage:directory": {"directory": "/tmp"},  # (Go's default directory is not on this machine)
    "processors_k8sattributes:filter::node_from_env_var": {"filter": {"node_from_env_var": "PATH"}},  # (a variable that is set)
}
# Go's TLS sections need a certificate and its key, as ours do: a TLS key is set beside them.
TLS_PAIR = {"cert": {"file": "/etc/ssl/collector.crt", "pem": "-----BEGIN CERTIFICATE-----"},
            "key": {"file": "/etc/ssl/collector.key", "pem": "-----BEGIN PRIVATE KEY-----"}}


@functools.lru_cache(maxsize=None)
def go_keys(name: str) -> dict:
    """(Read at collection, three times a file: cached, and with libyaml's loader, 20 times faster
    than the pure Python one's 6.6 s for the 34 files.)"""
    return yaml.load((GO_CONFIG / f"{name}.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def example(spec: dict):
    """A value Go accepts for the key: its default when that is one, else a plain value of its type."""
    spec = spec if isinstance(spec, dict) else {"type": str(spec)}
    if spec.get("allowed"):
        return spec["allowed"][0] if spec["allowed"][0] != "" else spec["allowed"][-1]
    default = spec.get("default")
    kind = str(spec.get("type", "")).lower()
    if "optional" in kind or kind == "map" or "section" in kind:
        return {}  # (an optional section written empty: on, with its defaults)
    if default not in (None, "", [], {}) and not (isinstance(default, str) and ("nil" in default or "disabled" in default or default.startswith("{"))):
        return default
    if "duration" in kind:
        return "1s"
    if kind.startswith("bool"):
        return True
    if kind.startswith(("int", "uint", "float")):
        return 1
    if kind.startswith("list"):
        return []
    if "map" in kind or "section" in kind:
        return {}
    return "x"


def nested(path: str, value) -> dict:
    node: dict = {}
    parts = path.split("::")
    for part in reversed(parts):
        node = {part: value}
        value = node
    return node


def with_certificate(path: str) -> dict:
    """The certificate and key a TLS section at ``path`` needs, but the one the key under test gives."""
    tls_path, _, key = path.partition("tls")
    key = key.strip(":")
    given = {"cert": "pem" if key == "cert_pem" else "file", "key": "pem" if key == "key_pem" else "file"}
    pair = {f"{name}_{form}": TLS_PAIR[name][form] for name, form in given.items()}
    return nested(f"{tls_path}tls", pair)


def merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = merge(merged[key], value) if isinstance(merged.get(key), dict) and isinstance(value, dict) else value
    return merged


def cases():
    for name, (section, type_, base) in COMPONENTS.items():
        for path, spec in (go_keys(name).get("keys") or {}).items():
            if "[]" in path:
                continue  # (a list element's keys: checked with the list's own tests)
            needs = SECTION_NEEDS.get((name, path.split("::")[0]), {})
            yield pytest.param(section, type_, merge(base, needs), path, spec, EXAMPLES.get(f"{name}:{path}"), id=f"{name}:{path}")


@pytest.mark.parametrize("section, type_, base, path, spec, fragment", list(cases()))
def test_each_go_key_is_accepted_or_refused_by_name(section, type_, base, path, spec, fragment):
    config = merge(base, fragment if fragment is not None else nested(path, example(spec)))
    # A server's TLS needs its certificate and key; a client's certificate needs its key.
    server_tls = section in ("receivers", "extensions") and ("tls::" in path or path == "tls" or path.endswith("::tls"))
    client_certificate = section == "exporters" and path.split("::")[-1] in ("cert_file", "cert_pem", "key_file", "key_pem")
    if server_tls or client_certificate:
        config = merge(with_certificate(path), config)
    problems = problems_of(section, type_, config)
    parts = path.split("::")
    # Refused by name: the key's path, or the section it is in (a Go section not here at all).
    named = [f"{section}::{type_}::{'::'.join(parts[:depth])}" for depth in range(len(parts), 0, -1)]
    refused_by_name = len(problems) == 1 and "not supported by pycollector" in problems[0] and problems[0].startswith(tuple(named))
    assert problems == [] or refused_by_name, (config, problems)


def test_every_component_we_share_with_go_has_its_key_list_and_release():
    for name in COMPONENTS:
        listed = go_keys(name)
        assert str(listed.get("go_release", "")).startswith("v0."), name


# -- what Go refuses ------------------------------------------------------------------------------

# Go's refusals this collector makes at another moment, or deliberately does not make (README).
NOT_REFUSED_HERE = {
    "processors_resource": ["default_value"],  # (a key of contrib 0.152, which the 0.150 list predates)
    "processors_k8sattributes": ["replicaset is not a valid choice", "pod_delete_grace_period"],  # (0.152+ accept them)
    "exporters_file": ["compression is not supported"],  # gzip is accepted beside Go's zstd
}
# When Go refuses: at config time (unmarshal, Validate) or only when the component is created or
# started; this test reads configs, the start-time ones are the components' own tests.
AT_START = ("start", "create")


def refusals():
    for name, (section, type_, base) in COMPONENTS.items():
        for index, entry in enumerate(go_keys(name).get("invalid") or []):
            config, error = entry.get("config"), str(entry.get("error", ""))
            when = str(entry.get("phase") or entry.get("when") or "")
            if not isinstance(config, dict) or when in AT_START or "at start" in error or "Start fails" in error or error.startswith("failed creating"):
                continue
            if entry.get("signal") not in (None, "profiles") or any(text in error for text in NOT_REFUSED_HERE.get(name, [])):
                continue
            yield pytest.param(section, type_, config, error, id=f"{name}:{index}")


@pytest.mark.parametrize("section, type_, config, error", list(refusals()))
def test_what_go_refuses_is_refused(section, type_, config, error, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (relative paths in the examples stay in a scratch directory)
    problems = problems_of(section, type_, config)
    assert problems, f"accepted, where Go says: {error}"
    assert all(problem.startswith(f"{section}::{type_}") for problem in problems), problems
