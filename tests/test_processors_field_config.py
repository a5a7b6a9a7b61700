"""A processor chain from the field validates: memory_limiter, batch and resource in front of an
exporter (k8sattributes and otlphttp/pyroscope are commented out in the file until they exist)."""

from pathlib import Path

import pycollector.config
from pycollector.config.validate import build_plan
from pycollector.registry import Registry

FIELD_CONFIG = Path(__file__).parent / "testdata" / "processors" / "pyroscope_field.yaml"


def test_the_pyroscope_field_config_validates(monkeypatch):
    monkeypatch.setenv("KUBE_NODE_NAME", "node-1")  # (as the DaemonSet's pod gives it, from spec.nodeName)
    plan = build_plan(pycollector.config.load([str(FIELD_CONFIG)]), Registry())
    pipeline = plan.pipelines["profiles"]
    assert pipeline.processors == ["memory_limiter", "k8sattributes", "batch", "resource/pyroscope"]
    assert pipeline.exporters == ["otlphttp/pyroscope"]
    # Both deprecated names resolve to today's components.
    assert plan.component("processors", "k8sattributes").factory.type == "k8s_attributes"
    assert plan.component("exporters", "otlphttp/pyroscope").factory.type == "otlp_http"
    batch = plan.component("processors", "batch").config
    assert (batch.timeout, batch.send_batch_size, batch.send_batch_max_size) == (10.0, 1024, 2048)
    limiter = plan.component("processors", "memory_limiter").config
    assert (limiter.check_interval, limiter.limit_mib, limiter.spike_limit_mib) == (1.0, 512, 128)
    [action] = plan.component("processors", "resource/pyroscope").config.attributes
    assert (action.key, action.from_attribute, action.action) == ("service.name", "process.executable.name", "upsert")
