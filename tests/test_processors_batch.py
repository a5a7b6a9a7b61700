"""The batch processor: merge and split keep every sample, triggers and their metrics, draining,
backpressure, and the other signals."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from structlog.testing import capture_logs

from pycollector.component import PermanentError, RefusedError
from pycollector.config.validate import build_plan
from pycollector.pdata import ProfilesBuilder, item_count, key_values, sample_count, split_at, validate_indices
from pycollector.pdata.serialized import SerializedProfiles
from pycollector.service import Service
from pycollector.telemetry import Telemetry
from pycollector.testing import CapturingConsumer, TestHost, make_settings, registry_with

from processors.batch.factory import factory
from tests.components import Journal, factories, one_profile
from tests.test_pdata import _actual_samples, _build, _inputs, _table_sizes
from tests.test_processors_support import component, validation_problems

LABELS = {"processor": "batch"}

# Every test here runs with the C extension and with the pure-Python fallback.
pytestmark = pytest.mark.usefixtures("profiles_codec")


def started_batch(downstream, telemetry: Telemetry | None = None, **config):
    processor = factory.create(make_settings("processors", "batch", telemetry), factory.config_model.model_validate(config), downstream)
    processor.start(TestHost())
    return processor


def with_links(data):
    """Give every other sample a link, so splitting has links to carry into each part too."""
    builder = ProfilesBuilder(data)
    samples = [s for rp in data.resource_profiles for sp in rp.scope_profiles for p in sp.profiles for s in p.samples]
    for number, sample in enumerate(samples):
        if number % 2:
            sample.link_index = builder.link(bytes([number % 5 + 1]) * 16, bytes([number % 3 + 1]) * 8)
    return data


def samples_with_links(data) -> list[tuple]:
    links = data.dictionary.link_table
    sample_links = [
        (links[s.link_index].trace_id, links[s.link_index].span_id) if s.link_index else None
        for rp in data.resource_profiles
        for sp in rp.scope_profiles
        for p in sp.profiles
        for s in p.samples
    ]
    return [(*sample, link) for sample, link in zip(_actual_samples(data), sample_links, strict=True)]


# -- the property: whatever the sizes, batching then splitting gives back every sample ------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    inputs=_inputs,
    send_batch_size=st.integers(1, 12),
    headroom=st.none() | st.integers(0, 8),
    timed=st.booleans(),
)
def test_batched_then_split_profiles_give_back_exactly_the_same_samples(inputs, send_batch_size, headroom, timed):
    messages = [with_links(_build(resources)) for resources in inputs]
    expected = [sample for message in messages for sample in samples_with_links(message)]
    max_size = 0 if headroom is None else send_batch_size + headroom
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout="1h" if timed else 0, send_batch_size=send_batch_size, send_batch_max_size=max_size)
    for message in messages:
        processor.consume(message)
    processor.shutdown()

    sent = downstream.messages
    assert [sample for batch in sent for sample in samples_with_links(batch)] == expected
    for batch in sent:
        assert validate_indices(batch) == []
        assert 0 < sample_count(batch) <= (max_size or len(expected))
    if timed:  # every batch but the one shutdown flushed was sent because it was full
        assert all(sample_count(batch) >= send_batch_size for batch in sent[:-1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(inputs=_inputs, cut=st.integers(0, 40))
def test_a_split_carries_only_the_dictionary_entries_its_samples_use(inputs, cut):
    whole = ProfilesBuilder()
    for resources in inputs:
        whole.merge(with_links(_build(resources)))
    head, tail = split_at(whole.data, cut)
    assert samples_with_links(head) + samples_with_links(tail) == samples_with_links(whole.data)
    for part in (head, tail):
        assert validate_indices(part) == []
        # Re-interning a part into a fresh builder adds nothing: it holds no unused entries (an
        # empty part may have no dictionary at all, its zero entries implied).
        again = ProfilesBuilder()
        again.merge(part)
        assert _table_sizes(again.data) == {name: max(size, 1) for name, size in _table_sizes(part).items()}
    # A cut that takes everything, or nothing, is the message itself.
    assert split_at(whole.data, sample_count(whole.data))[0] is whole.data
    assert split_at(whole.data, 0)[1 if sample_count(whole.data) else 0] is whole.data


# -- triggers, timing and their metrics ---------------------------------------------------------


def batch_service(journal: Journal, **batch_config) -> Service:
    config = {
        "receivers": {"recorder": {}},
        "processors": {"batch": batch_config},
        "exporters": {"keeper": {}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"profiles": {"receivers": ["recorder"], "processors": ["batch"], "exporters": ["keeper"]}},
        },
    }
    return Service(build_plan(config, registry_with(**factories(journal))))


def metric(service: Service, name: str) -> float:
    return service.telemetry.sample(name, LABELS) or 0.0


def test_full_batches_go_out_at_once_and_the_rest_when_the_timeout_passes():
    journal = Journal()
    service = batch_service(journal, timeout="300ms", send_batch_size=10)
    service.start()
    arrivals: list[float] = []
    keeper = component(service, "exporters")
    original_consume = keeper.consume
    keeper.consume = lambda data: (arrivals.append(time.monotonic()), original_consume(data))
    try:
        began = time.monotonic()
        for _ in range(5):  # 25 samples in messages of 5: full at 10 and 20, 5 left over
            component(service, "receivers").push(one_profile(samples=5))
        sizes_before_timeout = [sample_count(m) for m in journal.received.get("keeper", [])]
        assert sizes_before_timeout == [10, 10]
        assert metric(service, "otelcol_processor_batch_batch_size_trigger_send_total") == 2
        assert metric(service, "otelcol_processor_batch_timeout_trigger_send_total") == 0

        deadline = time.monotonic() + 3
        while len(journal.received["keeper"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [sample_count(m) for m in journal.received["keeper"]] == [10, 10, 5]
        # The rest went out one timeout after the previous send, not before.
        assert 0.25 <= arrivals[2] - arrivals[1] < 1.0, arrivals
        assert arrivals[1] - began < 0.25
        assert metric(service, "otelcol_processor_batch_timeout_trigger_send_total") == 1
        assert metric(service, "otelcol_processor_batch_batch_send_size_count") == 3
        assert metric(service, "otelcol_processor_batch_batch_send_size_sum") == 25
        assert metric(service, "otelcol_processor_batch_metadata_cardinality") == 1
        # The engine's own counters agree: 25 in, 25 out, fewer and larger messages.
        assert service.telemetry.sample("otelcol_processor_incoming_items_total", {**LABELS, "otel_signal": "profiles"}) == 25
        assert service.telemetry.sample("otelcol_processor_outgoing_items_total", {**LABELS, "otel_signal": "profiles"}) == 25
    finally:
        service.shutdown()


def test_shutdown_drains_what_is_held_into_the_running_exporter():
    journal = Journal()
    service = batch_service(journal, timeout="1h", send_batch_size=1000)
    service.start()
    keeper = component(service, "exporters")
    original_consume = keeper.consume
    keeper.consume = lambda data: (journal.note("consume", "keeper"), original_consume(data))
    for _ in range(3):
        component(service, "receivers").push(one_profile(samples=2))
    assert "keeper" not in journal.received
    service.shutdown()
    [drained] = journal.received["keeper"]
    assert sample_count(drained) == 6
    assert validate_indices(drained) == []
    # The exporter was still running when the batch flushed into it.
    assert journal.events.index(("consume", "keeper")) < journal.events.index(("shutdown", "keeper"))


def test_oversized_input_is_cut_to_send_batch_max_size():
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout="1h", send_batch_size=4, send_batch_max_size=6)
    processor.consume(one_profile(samples=15))
    assert [sample_count(m) for m in downstream.messages] == [6, 6]
    processor.shutdown()
    assert [sample_count(m) for m in downstream.messages] == [6, 6, 3]


def test_with_timeout_zero_every_message_goes_out_at_once():
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout=0)
    processor.consume(one_profile(samples=3))
    assert [sample_count(m) for m in downstream.messages] == [3]
    processor.shutdown()


# -- downstream failures --------------------------------------------------------------------------


class ScriptedConsumer(CapturingConsumer):
    """Raises the next error of ``errors`` (None: accept) on each consume."""

    def __init__(self, errors):
        super().__init__()
        self.errors = list(errors)

    def consume(self, data):
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        super().consume(data)


def test_a_refusal_on_the_callers_send_refuses_its_items_and_keeps_those_accepted_before():
    downstream = ScriptedConsumer([RefusedError("busy")])
    processor = started_batch(downstream, timeout="1h", send_batch_size=5)
    processor.consume(one_profile(samples=3))  # held: below send_batch_size
    with pytest.raises(RefusedError, match="busy"):
        processor.consume(one_profile(samples=4))  # fills the batch; downstream refuses
    processor.consume(one_profile(samples=2))  # 3 kept + 2: full again, goes out
    assert [sample_count(m) for m in downstream.messages] == [5]
    processor.shutdown()
    assert [sample_count(m) for m in downstream.messages] == [5]


def test_a_failed_timeout_send_is_dropped_counted_and_logged_once_per_interval():
    telemetry = Telemetry()
    failures = ScriptedConsumer([PermanentError("backend said no")] * 2)
    with capture_logs() as logged:
        processor = started_batch(failures, telemetry, timeout="50ms", send_batch_size=100)
        processor.consume(one_profile(samples=3))
        time.sleep(0.2)
        processor.consume(one_profile(samples=4))
        time.sleep(0.2)
        processor.consume(one_profile(samples=1))
        processor.shutdown()
    assert [sample_count(m) for m in failures.messages] == [1]
    assert telemetry.sample("otelcol_processor_dropped_profile_samples_total", LABELS) == 7
    assert telemetry.sample("otelcol_processor_batch_timeout_trigger_send_total", LABELS) == 1
    assert [entry["event"] for entry in logged] == ["sender failed; batch dropped"]


def test_profiles_that_refer_outside_their_dictionary_are_a_permanent_error():
    broken = one_profile()
    broken.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 99
    processor = started_batch(CapturingConsumer(), timeout="1h")
    with pytest.raises(PermanentError, match="outside their dictionary"):
        processor.consume(broken)
    processor.shutdown()


def test_the_first_message_goes_out_as_it_came_and_is_never_changed(profiles_codec):
    first, second = with_links(one_profile(samples=3)), one_profile(samples=2)
    first_bytes = first.SerializeToString()
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout=0)
    processor.consume(first)
    assert downstream.messages == [first]
    if profiles_codec == "pure Python":
        assert downstream.messages[0] is first  # not copied
    else:  # as bytes, never parsed
        assert isinstance(downstream.given[0], SerializedProfiles) and downstream.given[0].samples == 3
    kept = CapturingConsumer()
    batched = started_batch(kept, timeout="1h", send_batch_size=100)
    batched.consume(first)
    batched.consume(second)  # appended to a copy of first, which its sender may still hold
    batched.shutdown()
    processor.shutdown()
    assert first.SerializeToString() == first_bytes
    [merged] = kept.messages
    assert samples_with_links(merged) == samples_with_links(first) + samples_with_links(second)


def test_a_bad_message_into_a_batch_is_refused_and_leaves_the_batch_as_it_was():
    good, bad, later = one_profile(samples=2), one_profile(samples=3), one_profile(samples=1)
    bad.dictionary.location_table[1].mapping_index = 50
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout="1h", send_batch_size=100)
    processor.consume(good)
    with pytest.raises(PermanentError, match="mapping_index = 50"):
        processor.consume(bad)
    processor.consume(later)
    processor.shutdown()
    [batch] = downstream.messages
    assert validate_indices(batch) == []
    assert samples_with_links(batch) == samples_with_links(good) + samples_with_links(later)


# -- traces, metrics, logs ------------------------------------------------------------------------


def traces(spans: int, service: str = "svc"):
    resource = {"attributes": key_values({"service.name": service})}
    spans_ = [trace_pb2.Span(name=f"{service}-{n}", span_id=bytes([n + 1]) * 8) for n in range(spans)]
    return trace_pb2.TracesData(resource_spans=[{"resource": resource, "scope_spans": [{"scope": {"name": "lib"}, "spans": spans_}]}])


def metrics(points: int):
    gauge = metrics_pb2.Gauge(data_points=[metrics_pb2.NumberDataPoint(as_int=n) for n in range(points)])
    histogram = metrics_pb2.Histogram(aggregation_temporality=2, data_points=[metrics_pb2.HistogramDataPoint(count=n) for n in range(points)])
    return metrics_pb2.MetricsData(
        resource_metrics=[{"scope_metrics": [{"metrics": [{"name": "g", "unit": "1", "gauge": gauge}, {"name": "h", "histogram": histogram}]}]}]
    )


def logs(records: int):
    log_records = [logs_pb2.LogRecord(time_unix_nano=n) for n in range(records)]
    return logs_pb2.LogsData(resource_logs=[{"scope_logs": [{"log_records": log_records}]}])


@pytest.mark.parametrize("make", [traces, metrics, logs], ids=["traces", "metrics", "logs"])
def test_other_signals_are_merged_and_cut_by_item_count(make):
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout="1h", send_batch_size=5, send_batch_max_size=5)
    inputs = [make(3), make(4), make(1)]
    for message in inputs:
        processor.consume(message)
    processor.shutdown()
    total = sum(item_count(m) for m in inputs)
    assert [item_count(m) for m in downstream.messages] == [5] * (total // 5) + ([total % 5] if total % 5 else [])


def test_a_cut_through_a_metric_repeats_the_metric_around_its_points():
    head, tail = split_at(metrics(4), 6)  # gauge g has points 0-3, histogram h has 0-3
    [head_metrics] = [scope.metrics for rm in head.resource_metrics for scope in rm.scope_metrics]
    [tail_metrics] = [scope.metrics for rm in tail.resource_metrics for scope in rm.scope_metrics]
    assert [(m.name, len(m.gauge.data_points or m.histogram.data_points)) for m in head_metrics] == [("g", 4), ("h", 2)]
    assert [(m.name, [p.count for p in m.histogram.data_points]) for m in tail_metrics] == [("h", [2, 3])]
    assert tail_metrics[0].histogram.aggregation_temporality == 2


def test_a_cut_through_spans_repeats_resource_and_scope():
    head, tail = split_at(traces(5, "checkout"), 2)
    for part, names in ((head, ["checkout-0", "checkout-1"]), (tail, ["checkout-2", "checkout-3", "checkout-4"])):
        [resource_spans] = part.resource_spans
        assert resource_spans.resource.attributes[0].value.string_value == "checkout"
        assert resource_spans.scope_spans[0].scope.name == "lib"
        assert [span.name for span in resource_spans.scope_spans[0].spans] == names


# -- configuration -------------------------------------------------------------------------------


def test_a_max_size_below_the_batch_size_is_an_error_on_that_key():
    assert validation_problems("batch", {"send_batch_size": 100, "send_batch_max_size": 50}) == [
        "processors::batch::send_batch_max_size: 50 is below send_batch_size (100): use at least 100, or 0 for no limit"
    ]
    assert validation_problems("batch", {"send_batch_size": 100, "send_batch_max_size": 0}) == []


def test_duplicate_metadata_keys_are_an_error():
    assert validation_problems("batch", {"metadata_keys": ["tenant", "Tenant"]}) == [
        "processors::batch::metadata_keys: duplicate entry 'tenant' (keys are case-insensitive)"
    ]


def test_concurrent_senders_lose_nothing():
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout="20ms", send_batch_size=7, send_batch_max_size=9)

    def send():
        for _ in range(30):
            processor.consume(one_profile(samples=3))

    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    processor.shutdown()
    assert sum(sample_count(m) for m in downstream.messages) == 4 * 30 * 3
    assert all(sample_count(m) <= 9 for m in downstream.messages)


def test_the_timer_rests_while_the_batch_is_empty_and_keeps_its_cadence_after():
    """An agent reports every few seconds: between reports the batch is empty, and its timer
    is not woken every ``timeout`` for nothing (it was, five times a second at 200 ms). Data that
    comes after a rest goes out at the timer's next tick, as if it had ticked all along."""
    downstream = CapturingConsumer()
    processor = started_batch(downstream, timeout="100ms", send_batch_size=1000)
    waits = []
    original_wait = processor._changed.wait
    processor._changed.wait = lambda timeout=None: (waits.append(timeout), original_wait(timeout))[1]
    try:
        began = time.monotonic()
        processor.consume(one_profile(samples=2))
        deadline = time.monotonic() + 5
        while not downstream.messages and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [sample_count(m) for m in downstream.messages] == [2]
        sent = time.monotonic()
        time.sleep(1.0)  # ten timeouts with nothing to send
        rested = len(waits)
        assert rested <= 3, waits  # (the send's tick, then a wait for data: not ten)
        assert waits[-1] is None
        processor.consume(one_profile(samples=3))
        deadline = time.monotonic() + 5
        while len(downstream.messages) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [sample_count(m) for m in downstream.messages] == [2, 3]
        assert time.monotonic() - began >= 1.0 and sent - began >= 0.09
    finally:
        processor.shutdown()
