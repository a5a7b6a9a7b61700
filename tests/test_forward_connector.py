"""The forward connector joins two pipelines: a receiver's data reaches the second pipeline's
exporter through the first pipeline's processor."""

from pycollector.config.validate import build_plan
from pycollector.pdata import to_dict
from pycollector.service import Service
from pycollector.testing import receiver_of, registry_with

from tests.components import Journal, factories, one_profile


def test_forward_connects_two_pipelines():
    journal = Journal()
    config = {
        "receivers": {"recorder": {}},
        "processors": {"tagger": {"value": "first"}},
        "exporters": {"keeper": {}},
        "connectors": {"forward": {}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {
                "profiles/in": {"receivers": ["recorder"], "processors": ["tagger"], "exporters": ["forward"]},
                "profiles/out": {"receivers": ["forward"], "exporters": ["keeper"]},
            },
        },
    }
    test_factories = factories(journal)
    del test_factories["connectors"]  # the installed forward connector, not the test's
    service = Service(build_plan(config, registry_with(**test_factories)))
    service.start()
    receiver_of(service).push(one_profile())
    service.shutdown()
    [received] = journal.received["keeper"]
    assert to_dict(received.resource_profiles[0].resource.attributes)["tag.tagger"] == "first"
