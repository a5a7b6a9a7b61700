"""The example third-party exporter, installed as its own distribution, runs in a pipeline."""

import csv

from pycollector.config.validate import build_plan
from pycollector.service import Service
from pycollector.testing import receiver_of, registry_with

from tests.components import Journal, factories, one_profile


def test_installed_example_plugin_runs_in_a_pipeline(tmp_path):
    journal = Journal()
    # The recorder receiver is this test's; sample_counts comes from the installed entry point.
    registry = registry_with(receivers=factories(journal)["receivers"])
    out = tmp_path / "counts.csv"
    config = {
        "receivers": {"recorder": {}},
        "exporters": {"sample_counts": {"path": str(out), "group_by": "process.pid"}},
        "service": {"pipelines": {"profiles": {"receivers": ["recorder"], "exporters": ["sample_counts"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    plan = build_plan(config, registry)
    assert plan.component("exporters", "sample_counts").plugin.distribution.startswith("pycollector-example-exporter")
    service = Service(plan)
    service.start()
    recorder = receiver_of(service)
    recorder.push(one_profile(samples=4))
    assert service.telemetry.sample("example_sample_counts_rows_total", {"exporter": "sample_counts"}) == 1
    assert service.telemetry.sample("otelcol_exporter_sent_profile_samples_total", {"exporter": "sample_counts"}) == 4
    service.shutdown()
    assert [row[1:] for row in csv.reader(out.open())] == [["1", "4"]]
