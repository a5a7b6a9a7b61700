"""Batching by request metadata (`metadata_keys`): one batch per combination of values, sent with
that metadata as its client, and a cardinality limit that refuses data bringing one more."""

from __future__ import annotations

import grpc
import pytest

from pycollector.client import ClientInfo, client_context
from pycollector.component import PermanentError
from pycollector.config.validate import build_plan
from pycollector.pdata import sample_count
from pycollector.service import Service
from pycollector.telemetry import Telemetry
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from tests.components import one_profile
from tests.test_otlp_support import ClientRecorder, export_grpc
from tests.test_processors_batch import started_batch


def send_as(processor, metadata: dict[str, tuple[str, ...]], samples: int, address: str = "10.0.0.9") -> None:
    with client_context(ClientInfo(address, metadata)):
        processor.consume(one_profile(samples=samples))


def test_each_combination_of_metadata_values_is_batched_on_its_own_and_sent_with_that_metadata():
    downstream = ClientRecorder()
    telemetry = Telemetry()
    processor = started_batch(downstream, telemetry, timeout="1h", send_batch_size=5, metadata_keys=["X-Tenant", "region"])
    send_as(processor, {"x-tenant": ("acme",), "region": ("eu",), "other": ("dropped",)}, 3)
    send_as(processor, {"x-tenant": ("globex",), "region": ("eu",)}, 3)
    send_as(processor, {"x-tenant": ("acme",), "region": ("us",)}, 1)
    assert downstream.messages == []  # no combination holds 5 samples yet
    send_as(processor, {"x-tenant": ("acme",), "region": ("eu",)}, 2)
    [full] = downstream.messages
    assert sample_count(full) == 5
    assert downstream.clients[0] == ClientInfo("", {"x-tenant": ("acme",), "region": ("eu",)})
    assert telemetry.sample("otelcol_processor_batch_metadata_cardinality", {"processor": "batch"}) == 3
    processor.shutdown()
    sent = {tuple(sorted(client.metadata.items())): sample_count(message) for client, message in zip(downstream.clients, downstream.messages)}
    assert sent == {
        (("region", ("eu",)), ("x-tenant", ("acme",))): 5,
        (("region", ("eu",)), ("x-tenant", ("globex",))): 3,
        (("region", ("us",)), ("x-tenant", ("acme",))): 1,
    }


def test_a_new_combination_past_the_cardinality_limit_is_refused_for_good():
    downstream = ClientRecorder()
    processor = started_batch(downstream, timeout="1h", metadata_keys=["x-tenant"], metadata_cardinality_limit=2)
    send_as(processor, {"x-tenant": ("a",)}, 1)
    send_as(processor, {}, 1)  # no value is a combination too, as in Go
    with pytest.raises(PermanentError, match="metadata_cardinality_limit 2"):
        send_as(processor, {"x-tenant": ("c",)}, 1)
    send_as(processor, {"x-tenant": ("a",)}, 1)  # known combinations still flow
    processor.shutdown()
    assert sorted(sample_count(m) for m in downstream.messages) == [1, 2]


def test_without_metadata_keys_downstream_sees_no_client():
    downstream = ClientRecorder()
    processor = started_batch(downstream, timeout=0)
    send_as(processor, {"x-tenant": ("a",)}, 1)
    processor.shutdown()
    assert downstream.clients == [ClientInfo()]  # as Go: a batch belongs to no single sender


def test_tenants_sending_over_grpc_get_batches_of_their_own():
    capture = CapturingExporterFactory()
    recorder = ClientRecorder()
    capture.consumer = recorder
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "include_metadata": True}}}},
        "processors": {"batch": {"metadata_keys": ["x-tenant"], "timeout": "1h", "send_batch_size": 6}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    try:
        receiver = receiver_of(service)
        endpoint = "{}:{}".format(*receiver.grpc_address)
        for tenant in ("acme", "globex", "acme", "globex"):
            assert export_grpc(endpoint, one_profile(samples=3), metadata=[("x-tenant", tenant)]) == grpc.StatusCode.OK
        assert recorder.wait_for(lambda c: len(c.messages) == 2, timeout=5)
    finally:
        service.shutdown()
    assert sorted((client.get("x-tenant"), sample_count(m)) for client, m in zip(recorder.clients, recorder.messages)) == [(("acme",), 6), (("globex",), 6)]
