"""The pipeline graph and service lifecycle, with in-process components that journal events."""

import urllib.request
from pathlib import Path

import pytest

from pycollector.component import RefusedError, StartError
from pycollector.config import load
from pycollector.config.validate import build_plan
from pycollector.pdata import to_dict
from pycollector.service import Service
from pycollector.testing import receiver_of, registry_with

from tests.components import Journal, factories, one_profile

TESTDATA = Path(__file__).parent / "testdata" / "config"


def service_for(config: dict, journal: Journal) -> Service:
    config.setdefault("service", {}).setdefault("telemetry", {"metrics": {"level": "none"}})
    return Service(build_plan(config, registry_with(**factories(journal))))


SHARED = {
    "receivers": {"recorder": {}, "recorder/b": {}},
    "processors": {"tagger/one": {}, "tagger/two": {}},
    "exporters": {"keeper": {}, "keeper/other": {}},
    "service": {
        "pipelines": {
            "profiles/a": {"receivers": ["recorder"], "processors": ["tagger/one"], "exporters": ["keeper"]},
            "profiles/b": {"receivers": ["recorder", "recorder/b"], "processors": ["tagger/two"], "exporters": ["keeper", "keeper/other"]},
        }
    },
}


def shared_config():
    import copy

    return copy.deepcopy(SHARED)


def test_shared_receiver_fans_out_and_each_pipeline_gets_its_own_copy():
    journal = Journal()
    service = service_for(shared_config(), journal)
    service.start()
    receiver_of(service, "recorder").push(one_profile())
    service.shutdown()
    # One receiver instance, one exporter instance: keeper saw the data once per pipeline.
    tags = sorted(tuple(sorted(k for k in to_dict(m.resource_profiles[0].resource.attributes) if k.startswith("tag."))) for m in journal.received["keeper"])
    # Each pipeline's processor edited its own copy, never the other pipeline's.
    assert tags == [("tag.tagger/one",), ("tag.tagger/two",)]
    assert len(journal.received["keeper/other"]) == 1


def test_an_edit_deep_in_one_pipeline_never_reaches_another():
    journal = Journal()
    config = {
        "receivers": {"recorder": {}},
        "processors": {"passer": {}, "tagger": {}},
        "exporters": {"keeper": {}, "keeper/other": {}},
        "service": {
            "pipelines": {
                "profiles/edits": {"receivers": ["recorder"], "processors": ["passer", "tagger"], "exporters": ["keeper"]},
                "profiles/plain": {"receivers": ["recorder"], "exporters": ["keeper/other"]},
            }
        },
    }
    service = service_for(config, journal)
    service.start()
    receiver_of(service, "recorder").push(one_profile())
    service.shutdown()
    [plain] = journal.received["keeper/other"]
    assert not any(key.startswith("tag.") for key in to_dict(plain.resource_profiles[0].resource.attributes))


def test_start_is_sinks_first_and_shutdown_is_sources_first():
    journal = Journal()
    service = service_for(shared_config(), journal)
    service.start()
    service.shutdown()
    started, stopped = journal.of("start"), journal.of("shutdown")
    for upstream, downstream in [("recorder", "tagger/one"), ("tagger/one", "keeper"), ("recorder/b", "tagger/two"), ("tagger/two", "keeper/other")]:
        assert started.index(downstream) < started.index(upstream)
        assert stopped.index(upstream) < stopped.index(downstream)
    assert sorted(started) == sorted(stopped)


def test_failed_start_stops_what_started_and_names_the_component():
    journal = Journal()
    journal.fail_start.add("recorder/b")
    service = service_for(shared_config(), journal)
    with pytest.raises(StartError, match=r"receivers::recorder/b: failed to start: port already in use"):
        service.start()
    # Everything that had started was shut down; nothing that never started was.
    assert sorted(journal.of("shutdown")) == sorted(journal.of("start"))
    assert "recorder/b" not in journal.of("shutdown")


def test_shutdown_twice_is_safe():
    journal = Journal()
    service = service_for(shared_config(), journal)
    service.start()
    service.shutdown()
    service.shutdown()
    assert len(journal.of("shutdown")) == len(journal.of("start"))


def test_connector_feeds_a_second_pipeline():
    journal = Journal()
    config = build_plan(load([str(TESTDATA / "valid_go_style.yaml")], env={}), registry_with(**factories(journal)))
    config.telemetry.metrics.level = "none"
    service = Service(config)
    service.start()
    receiver_of(service, "recorder/second").push(one_profile())
    service.shutdown()
    assert len(journal.received["forward_like"]) == 1
    # Exporters are debug exporters in that file; the connector's second pipeline ran its tagger.
    assert journal.of("start").index("tagger/b") < journal.of("start").index("forward_like")


def test_counters_follow_the_data_and_are_served():
    journal = Journal()
    config = shared_config()
    config["service"]["telemetry"] = {"metrics": {"address": "127.0.0.1:0"}}
    service = service_for(config, journal)
    service.start()
    try:
        receiver_of(service, "recorder").push(one_profile(samples=3))
        journal.refuse.add("keeper/other")
        with pytest.raises(RefusedError):
            receiver_of(service, "recorder/b").push(one_profile(samples=5))
        sample = service.telemetry.sample
        assert sample("otelcol_receiver_accepted_profile_samples_total", {"receiver": "recorder"}) == 3
        assert sample("otelcol_receiver_refused_profile_samples_total", {"receiver": "recorder/b"}) == 5
        assert sample("otelcol_exporter_sent_profile_samples_total", {"exporter": "keeper"}) == 3 + 3 + 5
        assert sample("otelcol_exporter_send_failed_profile_samples_total", {"exporter": "keeper/other"}) == 5
        assert sample("otelcol_processor_incoming_items_total", {"processor": "tagger/two", "otel_signal": "profiles"}) == 8
        host, port = service.metrics_address
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
        assert 'otelcol_exporter_sent_profile_samples_total{exporter="keeper"} 11.0' in text
        assert "otelcol_process_memory_rss_bytes" in text
    finally:
        service.shutdown()


def test_extensions_watching_statuses_see_every_component_start_and_fail():
    journal = Journal()
    journal.fail_start.add("recorder/b")
    seen = []

    class Watcher:
        def start(self, host):
            pass

        def shutdown(self):
            pass

        def on_component_status(self, source, status, error):
            seen.append((source, status, str(error) if error else None))

    service = service_for(shared_config(), journal)
    service.plan.extensions.append("watcher")
    from pycollector.config.validate import ComponentSpec
    from pycollector.component import ComponentID, Factory

    class WatcherFactory(Factory):
        type = "watcher"

        def create(self, settings, config, next_consumer):
            return Watcher()

    service.plan.components[("extensions", "watcher")] = ComponentSpec("extensions", ComponentID("watcher"), WatcherFactory(), None, None)
    with pytest.raises(StartError):
        service.start()
    assert ("exporters::keeper", "ok", None) in seen
    assert ("receivers::recorder/b", "failed", "port already in use") in seen
    assert ("exporters::keeper", "stopped", None) in seen
    assert service.statuses["receivers::recorder/b"][0] == "failed"
