"""OpenTelemetry process contexts (OTEP 4719): the resource an SDK in a sampled process publishes.

The publisher (tests/otel_context_publisher.py) does what an SDK does: a memfd or a named
anonymous mapping, the header with the signature written last, updates by the protocol. The
reader is checked against it directly, then end to end: a busy publisher's profiles carry its
service.name, and an update shows in later reports.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import struct
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from receivers.profiling.otel_context import process_context
from receivers.profiling.otel_context.process_context import ContextError, read_process_context
from receivers.profiling.processes.memory import ProcessMemory
from receivers.profiling.processes.proc import find_process_context

from tests.conftest import bpf_unavailable_reason

PUBLISHER = Path(__file__).with_name("otel_context_publisher.py")


def resource(**attributes) -> bytes:
    """An encoded Resource; a list value becomes an array of strings."""
    pairs = []
    for key, value in attributes.items():
        key = key.replace("__", ".")
        if isinstance(value, list):
            any_value = common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(string_value=v) for v in value]))
        elif isinstance(value, bool):
            any_value = common_pb2.AnyValue(bool_value=value)
        elif isinstance(value, int):
            any_value = common_pb2.AnyValue(int_value=value)
        else:
            any_value = common_pb2.AnyValue(string_value=value)
        pairs.append(common_pb2.KeyValue(key=key, value=any_value))
    return resource_pb2.Resource(attributes=pairs).SerializeToString()


class Publisher:
    def __init__(self, payload: bytes, kind: str = "memfd", activity: str = "idle"):
        self.process = subprocess.Popen([sys.executable, str(PUBLISHER), kind, activity], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.process.stdin.write(payload.hex() + "\n")
        self.process.stdin.flush()
        self.address = int(self.process.stdout.readline(), 16)
        self.pid = self.process.pid

    def update(self, payload: bytes) -> None:
        self.process.stdin.write(payload.hex() + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "updated"

    def close(self) -> None:
        self.process.stdin.close()
        self.process.kill()
        self.process.wait()


def maps_of(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as maps:
        return maps.read()


def anon_names_work() -> bool:
    region = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    named = ctypes.CDLL(None).prctl(0x53564D41, 0, ctypes.c_ulong(address), ctypes.c_ulong(4096), b"probe") == 0
    del address
    return named


@pytest.mark.parametrize("kind", ["memfd", "anon"])
def test_the_context_an_sdk_publishes_is_found_and_read(kind):
    if kind == "anon" and not anon_names_work():
        pytest.skip("this kernel does not name anonymous mappings (CONFIG_ANON_VMA_NAME)")
    publisher = Publisher(resource(service__name="checkout", service__version="1.4.2", deployment__environment__name="prod",
                                   threadlocal__schema_version="tlsdesc_v1_dev",
                                   threadlocal__attribute_key_map=["http.route", "http.request.method"]), kind)
    try:
        assert find_process_context(maps_of(publisher.pid)) == publisher.address
        with ProcessMemory(publisher.pid) as memory:
            context = read_process_context(memory, publisher.address)
            assert context.attributes == {"service.name": "checkout", "service.version": "1.4.2", "deployment.environment.name": "prod"}
            assert context.schema_version == "tlsdesc_v1_dev" and context.key_map == ("http.route", "http.request.method")
            publisher.update(resource(service__name="checkout", service__version="1.5.0"))
            updated = read_process_context(memory, publisher.address)
            assert updated.attributes["service.version"] == "1.5.0" and updated.published_at_ns > context.published_at_ns
    finally:
        publisher.close()


def test_a_hostile_context_is_held_to_its_budgets():
    attributes = {f"custom__key{i}": "v" for i in range(200)}
    attributes["custom__long"] = "x" * 5000
    publisher = Publisher(resource(custom__first="kept", **attributes, nested=["array", "dropped"]))
    try:
        with ProcessMemory(publisher.pid) as memory:
            context = read_process_context(memory, publisher.address)
        assert len(context.attributes) == process_context.MAX_ATTRIBUTES
        assert context.attributes["custom.first"] == "kept"
        assert context.dropped == 202 - process_context.MAX_ATTRIBUTES + 1  # past the cap, and the array
    finally:
        publisher.close()


def test_what_is_not_a_whole_context_is_refused():
    """A wrong signature or version, a payload over the cap, one that is no Resource, and a
    header whose update never ends (published_at_ns stays 0) are each a ContextError."""
    region = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    payload = resource(service__name="x")
    region[4096:4096 + len(payload)] = payload

    def header(signature=b"OTEL_CTX", version=2, size=len(payload), published=1, at=base + 4096):
        struct.pack_into("=8sIIQQ", region, 0, signature, version, size, published, at)

    import os
    with ProcessMemory(os.getpid()) as memory:
        header()
        assert read_process_context(memory, base).attributes == {"service.name": "x"}
        for bad, reason in ((dict(signature=b"OTEL_CTY"), "no process context"), (dict(version=3), "no process context"),
                            (dict(size=1 << 19), "over"), (dict(published=0), "changed under each"),
                            (dict(at=base + 4096 + 1, size=len(payload) - 1), "not a Resource")):
            header(**bad)
            with pytest.raises(ContextError, match=reason):
                read_process_context(memory, base)
    del base


@pytest.fixture(scope="module")
def service_and_capture(tmp_path_factory):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": 99, "reporter_interval": "1s",
                                    "unwind_cache_dir": str(tmp_path_factory.mktemp("cache"))}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    yield service, capture
    service.shutdown()


def resources_of(messages, pid: int) -> list[dict]:
    return [view.resource for message in messages for view in iter_samples(message) if view.resource.get("process.pid") == pid]


@pytest.mark.bpf
def test_profiles_carry_the_resource_the_process_publishes(service_and_capture):
    """Its service.name and the rest on its profiles; the agent's own measures kept (a process
    cannot pass for another pid); an update shows in the reports after it; threadlocal.* keys
    stay out of the export; a process without a context is as before."""
    service, capture = service_and_capture
    publisher = Publisher(resource(service__name="checkout", service__version="1.4.2", process__pid=1,
                                   threadlocal__schema_version="tlsdesc_v1_dev"), activity="busy")
    plain = subprocess.Popen([sys.executable, str(PUBLISHER), "none", "busy"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        messages = capture.consumer.messages
        capture.consumer.wait_for(lambda _: any(r.get("service.name") for r in resources_of(messages, publisher.pid)), timeout=30)
        first = resources_of(messages, publisher.pid)[-1]
        assert first["service.name"] == "checkout" and first["service.version"] == "1.4.2"
        assert first["process.pid"] == publisher.pid and "threadlocal.schema_version" not in first
        assert first["process.executable.name"].startswith("python")
        publisher.update(resource(service__name="checkout", service__version="1.5.0"))
        seen = len(messages)
        capture.consumer.wait_for(lambda _: any(r.get("service.version") == "1.5.0" for r in resources_of(messages[seen:], publisher.pid)),
                                  timeout=10)
        assert all("service.name" not in r for r in resources_of(messages, plain.pid))
        assert receiver_of(service).contexts.stats["processes_with_context"] >= 1
    finally:
        publisher.close()
        plain.kill()
        plain.wait()


# --------------------------------------------------------------------------------------------
# Thread contexts (OTEP 4947): the span each sample ran in

NATIVE = Path(__file__).with_name("native")
TRACE = bytes([0xAB] * 16)
HEAVY_SPAN, LIGHT_SPAN = bytes([0x11] * 8), bytes([0x22] * 8)


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    """The test programs, one per TLS model a reader must handle: the variable in the executable
    (local-exec), in a library linked in with TLS descriptors (static TLS once resolved), in
    the same library dlopen()ed (dynamic TLS, through the thread's DTV), and in libraries built
    for initial-exec (dlopen()ed, and linked in) and for the traditional general dynamic model."""
    out = tmp_path_factory.mktemp("thread-ctx")
    writer, main = NATIVE / "otel_thread_ctx.c", NATIVE / "otel_thread_ctx_main.c"

    def cc(*args: str) -> None:
        subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", *args], check=True, capture_output=True)

    cc("-fPIC", "-shared", "-mtls-dialect=gnu2", "-o", str(out / "libotelctx.so"), str(writer))
    cc("-fPIC", "-shared", "-mtls-dialect=gnu", "-o", str(out / "libotelctx-gd.so"), str(writer))
    cc("-fPIC", "-shared", "-ftls-model=initial-exec", "-o", str(out / "libotelctx-ie.so"), str(writer))
    cc("-rdynamic", "-o", str(out / "executable"), str(main), str(writer), "-ldl")
    cc("-o", str(out / "linked"), str(main), f"-L{out}", "-lotelctx", f"-Wl,-rpath,{out}", "-ldl")
    cc("-o", str(out / "linked-ie"), str(main), str(out / "libotelctx-ie.so"), f"-Wl,-rpath,{out}", "-ldl")
    cc("-DDLOPEN_ONLY", "-o", str(out / "dlopen"), str(main), "-ldl")
    return {
        "local-exec": [str(out / "executable")],
        "tlsdesc, static": [str(out / "linked")],
        "tlsdesc, dlopen": [str(out / "dlopen"), "dlopen", str(out / "libotelctx.so")],
        "general dynamic, dlopen": [str(out / "dlopen"), "dlopen", str(out / "libotelctx-gd.so")],
        "initial-exec, dlopen": [str(out / "dlopen"), "dlopen", str(out / "libotelctx-ie.so")],
        "initial-exec, linked": [str(out / "linked-ie")],
        "general dynamic, dlopen after the maps were read": [str(out / "dlopen"), "dlopen", str(out / "libotelctx-gd.so")],
    }


@pytest.mark.bpf
@pytest.mark.parametrize("model", ["local-exec", "tlsdesc, static", "tlsdesc, dlopen", "general dynamic, dlopen", "initial-exec, dlopen", "initial-exec, linked",
                                   "general dynamic, dlopen after the maps were read"])
def test_samples_carry_the_span_their_thread_ran_in(service_and_capture, writers, model):
    """The program runs spin_heavy in one span and spin_light in another (3:1): every sample
    under spin_heavy links to the first span, every one under spin_light to the second, and the
    kernel read the variable wherever the TLS model put it. A writer loaded after the agent read
    the process's maps (it works a second before its dlopen) is found within seconds."""
    service, capture = service_and_capture
    argv = writers[model]
    late = model.endswith("after the maps were read")
    payload = resource(service__name="spans", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=["http.route"])
    with _running(([argv[0], "30", *argv[1:]], {"OTEL_CTX_PAYLOAD": payload.hex(), **({"OTEL_CTX_DLOPEN_LATE": "1"} if late else {})})) as (process,):
        messages = capture.consumer.messages
        if late:  # its first samples were taken before the writer was there
            capture.consumer.wait_for(lambda _: _spans_by_leaf(messages, process.pid).get("warm_up"), timeout=10)  # seen before
        seen = _once_linked(capture, [process], seconds=3)
        spans = _spans_by_leaf(messages[seen:], process.pid)
        heavy, light = spans.get("spin_heavy", {}), spans.get("spin_light", {})
        assert sum(heavy.values()) > 50, spans
        assert heavy.get((TRACE, HEAVY_SPAN), 0) / sum(heavy.values()) > 0.95, heavy
        assert light.get((TRACE, LIGHT_SPAN), 0) / sum(light.values()) > 0.9, light
        assert receiver_of(service).contexts.stats["processes_with_thread_context"] >= 1
        routes = _routes_by_leaf(messages[seen:], process.pid)  # the record's attribute, named by the key map
        assert routes["spin_heavy"].get("/heavy", 0) / sum(routes["spin_heavy"].values()) > 0.95, routes
        assert routes["spin_light"].get("/light", 0) / sum(routes["spin_light"].values()) > 0.9, routes


@contextlib.contextmanager
def _running(*programs: tuple[list[str], dict]):
    """The test writers (argv, environment), each past its first record (it printed its line);
    killed when done."""
    processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) for argv, env in programs]
    try:
        for process in processes:
            process.stdout.readline()
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait()


def _once_linked(capture, linked: list, seconds: float, also: tuple = ()) -> int:
    """How many messages there are once each of ``linked`` has a sample linked to a span;
    returns when those after hold spin_light samples of them and of ``also``, ``seconds`` later."""
    messages = capture.consumer.messages
    seen = max(_linked_from(capture, process.pid) for process in linked)
    capture.consumer.wait_for(lambda _: all(_spans_by_leaf(messages[seen:], process.pid).get("spin_light") for process in (*linked, *also)), timeout=20)
    time.sleep(seconds)
    return seen


def _linked_from(capture, pid: int, timeout: float = 15) -> int:
    """How many messages there are once one links a sample of pid to a span: the ones after are
    of a process whose thread context the agent had found (it is linked from its first look
    after the process published, the parse of a new library's symbols taking a moment)."""
    messages = capture.consumer.messages
    capture.consumer.wait_for(lambda _: any(key is not None for spans in _spans_by_leaf(messages, pid).values() for key in spans), timeout=timeout)
    return len(messages)


def _spans_by_leaf(messages, pid: int) -> dict:
    """{leaf function: {(trace id, span id) or None: samples}} of process pid."""
    out: dict = {}
    for message in messages:
        links = message.dictionary.link_table
        for view in iter_samples(message):
            if view.resource.get("process.pid") != pid or not view.frames:
                continue
            link = links[view.sample.link_index] if view.sample.link_index else None
            key = (bytes(link.trace_id), bytes(link.span_id)) if link is not None else None
            leaf = out.setdefault(view.frames[0].function, {})
            leaf[key] = leaf.get(key, 0) + sum(view.values)
    return out


def _routes_by_leaf(messages, pid: int) -> dict:
    """{leaf function: {http.route or None: samples}} of process pid."""
    out: dict = {}
    for message in messages:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == pid and view.frames:
                leaf = out.setdefault(view.frames[0].function, {})
                route = view.attributes.get("http.route")
                leaf[route] = leaf.get(route, 0) + sum(view.values)
    return out


def test_a_span_naming_keys_its_process_never_publishes_costs_one_context_read_a_report():
    """A record whose attributes use key indices the key map lacks has the context read again
    (the OTEP: its map may have grown), but once a report, not once per span or sample."""
    import structlog

    from receivers.profiling.otel_context.contexts import ProcessContexts
    from receivers.profiling.processes.table import ProcessTable

    publisher = Publisher(resource(service__name="keys", threadlocal__schema_version="tlsdesc_v1_dev",
                                   threadlocal__attribute_key_map=["http.route"]))
    table = ProcessTable()
    contexts = ProcessContexts(table, structlog.get_logger())
    try:
        contexts._changed(table.snapshot(publisher.pid))
        assert contexts.context(publisher.pid).key_map == ("http.route",)
        unknown = bytes([0, 2]) + b"/a" + bytes([7, 1]) + b"x"  # index 7: not in its map
        for report in range(3):
            contexts.refresh([publisher.pid])
            reads = contexts.stats["reads"]
            for _ in range(50):
                assert contexts.span_attributes(publisher.pid, unknown) == {"http.route": "/a"}
            assert contexts.stats["reads"] == reads + 1, report
    finally:
        contexts.close()
        publisher.close()


def test_a_process_without_a_context_is_read_again_when_its_maps_change_not_each_look():
    """A process the table knows without a context is looked at again and again (an SDK may
    start late); each look compares its maps with the last (a digest) and reads them again, told
    to every watcher, only when they changed, or once RETELL_S passed (the watchers' retries ride
    on it). An SDK that publishes later is still found at the next look."""
    import structlog

    from receivers.profiling.otel_context.contexts import RETELL_S, ProcessContexts
    from receivers.profiling.processes.table import ProcessTable

    now = [1000.0]
    # (a publisher that maps its region only once told to go, as an SDK that starts late)
    starts_late = (f"import runpy, sys; sys.stdin.readline(); sys.argv = [{str(PUBLISHER)!r}, 'memfd', 'idle']; "
                   f"runpy.run_path({str(PUBLISHER)!r}, run_name='__main__')")
    late = subprocess.Popen([sys.executable, "-c", starts_late], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    table = ProcessTable()
    contexts = ProcessContexts(table, structlog.get_logger(), rescan_s=10, clock=lambda: now[0])
    try:
        deadline = time.monotonic() + 60
        while not Path(f"/proc/{late.pid}/syscall").read_text().startswith("0 0x0 "):  # (started: waiting to read stdin)
            assert time.monotonic() < deadline and late.poll() is None
            time.sleep(0.01)
        table.on_new_process(late.pid, late.pid, "python3")
        assert contexts.context(late.pid) is None

        def looks(count: int) -> int:
            """Maps read again in ``count`` looks, 10 s apart."""
            before = table.stats["maps_refreshes"]
            for _ in range(count):
                now[0] += 10
                contexts.refresh([late.pid])
            return table.stats["maps_refreshes"] - before

        assert looks(1) == 1  # (the first look: nothing to compare with)
        assert looks(int(RETELL_S // 10) - 1) == 0
        assert looks(1) == 1  # (RETELL_S since it was last told)
        late.stdin.write("go\n" + resource(service__name="late").hex() + "\n")
        late.stdin.flush()
        int(late.stdout.readline(), 16)  # (published)
        assert looks(1) == 1
        assert contexts.context(late.pid) is not None and contexts.context(late.pid).attributes == {"service.name": "late"}
    finally:
        contexts.close()
        late.stdin.close()
        late.kill()
        late.wait()


def test_a_context_whose_read_failed_is_read_again_at_a_look_that_finds_the_maps_unchanged(monkeypatch):
    """A context read that failed (an SDK caught writing it) is tried again at the next look,
    though the maps did not change and the process is not told to the watchers again."""
    import structlog

    from receivers.profiling.otel_context import contexts as contexts_module
    from receivers.profiling.otel_context.process_context import ContextError
    from receivers.profiling.processes.table import ProcessTable

    publisher = Publisher(resource(service__name="retried"))
    now = [1000.0]
    table = ProcessTable()
    contexts = contexts_module.ProcessContexts(table, structlog.get_logger(), rescan_s=10, clock=lambda: now[0])
    read = contexts_module.read_process_context

    def caught_writing(memory, address):
        raise ContextError("the header's signature is not written yet")

    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(f"/proc/{publisher.pid}/task")) < 2:  # (its updating thread's stack mapped: the maps settled)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        monkeypatch.setattr(contexts_module, "read_process_context", caught_writing)
        table.on_new_process(publisher.pid, publisher.pid, "python3")
        now[0] += 10
        contexts.refresh([publisher.pid])  # (the first look: read again, and failed again)
        assert contexts.context(publisher.pid) is None and contexts.stats["errors"] == 2
        monkeypatch.setattr(contexts_module, "read_process_context", read)
        refreshes = table.stats["maps_refreshes"]
        now[0] += 10
        contexts.refresh([publisher.pid])
        assert table.stats["maps_refreshes"] == refreshes  # (unchanged: not read again, nor told)
        assert contexts.context(publisher.pid) is not None and contexts.context(publisher.pid).attributes == {"service.name": "retried"}
    finally:
        contexts.close()
        publisher.close()


def test_a_records_attributes_are_named_by_the_key_map_and_a_bad_entry_stops_the_reading():
    from receivers.profiling.otel_context.thread_context import parse_attributes

    key_map = ("http.route", "http.request.method")
    data = bytes([0, 3]) + b"/a1" + bytes([1, 3]) + b"GET" + bytes([0, 3]) + b"/a2" + bytes([7, 1]) + b"x" + bytes([1, 9]) + b"cut"
    assert parse_attributes(data, key_map) == ({"http.route": "/a2", "http.request.method": "GET"}, True)
    assert parse_attributes(bytes([0, 2]) + b"\xff\xfe", key_map) == ({"http.route": "\ufffd\ufffd"}, False)


@pytest.mark.bpf
def test_a_publisher_of_garbage_costs_only_its_own_links(service_and_capture, writers):
    """A process whose thread context points into unmapped memory, with a key map of 256 keys:
    its spin_heavy samples carry no span (the reads that failed are counted), its spin_light ones
    still do, and a well-behaved publisher beside it keeps every link."""
    service, capture = service_and_capture
    keys = [f"key.{i}" for i in range(256)]
    payload = resource(service__name="garbage", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=keys)
    good_payload = resource(service__name="good", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=["http.route"])
    counters = receiver_of(service)._sampler.counters
    errors = counters()["thread_ctx_read_errors"]
    with _running(([writers["local-exec"][0], "30"], {"OTEL_CTX_PAYLOAD": payload.hex(), "OTEL_CTX_GARBAGE": "pointer"}),
                  ([writers["tlsdesc, static"][0], "30"], {"OTEL_CTX_PAYLOAD": good_payload.hex()})) as (hostile, good):
        messages = capture.consumer.messages
        seen = _once_linked(capture, [hostile, good], seconds=3)
        bad, fine = _spans_by_leaf(messages[seen:], hostile.pid), _spans_by_leaf(messages[seen:], good.pid)
        assert set(bad["spin_heavy"]) == {None}, bad  # pointed into unmapped memory: no span
        assert bad["spin_light"].get((TRACE, LIGHT_SPAN), 0) / sum(bad["spin_light"].values()) > 0.9, bad
        assert fine["spin_heavy"].get((TRACE, HEAVY_SPAN), 0) / sum(fine["spin_heavy"].values()) > 0.95, fine
        assert counters()["thread_ctx_read_errors"] > errors


@pytest.mark.bpf
def test_a_process_that_copies_anothers_span_ids_puts_nothing_on_its_samples(service_and_capture, writers):
    """Two processes write the same trace and span ids in their records (a span id is whatever a
    process writes there): the victim's key map names its attribute http.route, the copier's
    stolen.key. Each process's samples carry their own record's attributes: none of the
    victim's carries stolen.key, and its routes stay its own."""
    service, capture = service_and_capture
    victim_payload = resource(service__name="victim", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=["http.route"])
    copier_payload = resource(service__name="copier", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=["stolen.key"])
    with _running(([writers["tlsdesc, static"][0], "30"], {"OTEL_CTX_PAYLOAD": victim_payload.hex()}),
                  ([writers["local-exec"][0], "30"], {"OTEL_CTX_PAYLOAD": copier_payload.hex()})) as (victim, copier):
        messages = capture.consumer.messages
        seen = _once_linked(capture, [victim, copier], seconds=3)
        stolen = {pid: sum(sum(view.values) for message in messages[seen:] for view in iter_samples(message)
                           if view.resource.get("process.pid") == pid and "stolen.key" in view.attributes) for pid in (victim.pid, copier.pid)}
        routes = _routes_by_leaf(messages[seen:], victim.pid)
        assert stolen[victim.pid] == 0 and stolen[copier.pid] > 0, stolen
        assert routes["spin_heavy"].get("/heavy", 0) / sum(routes["spin_heavy"].values()) > 0.95, routes


@pytest.mark.bpf
def test_a_publisher_of_wrong_sizes_costs_only_what_it_lied_about(service_and_capture, writers):
    """A record that says its attributes take 65535 bytes: its samples keep their spans, its
    attributes are cut at the kernel's bound (counted). A process context whose header says
    the payload takes 2 GiB: refused (counted), the process profiled as any other."""
    service, capture = service_and_capture
    payload = resource(service__name="liar", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=["http.route"])
    counters, contexts = receiver_of(service)._sampler.counters, receiver_of(service).contexts
    cut, errors = counters()["thread_ctx_attrs_cut"], contexts.stats["errors"]
    with _running(([writers["local-exec"][0], "30"], {"OTEL_CTX_PAYLOAD": payload.hex(), "OTEL_CTX_GARBAGE": "size"}),
                  ([writers["local-exec"][0], "30"], {"OTEL_CTX_PAYLOAD": payload.hex(), "OTEL_CTX_LIE_SIZE": "1"})) as (big_record, big_header):
        messages = capture.consumer.messages
        seen = _once_linked(capture, [big_record], seconds=2, also=(big_header,))
        record_spans = _spans_by_leaf(messages[seen:], big_record.pid)
        assert record_spans["spin_heavy"].get((TRACE, HEAVY_SPAN), 0) / sum(record_spans["spin_heavy"].values()) > 0.9, record_spans
        assert counters()["thread_ctx_attrs_cut"] > cut
        assert _routes_by_leaf(messages[seen:], big_record.pid)["spin_light"].get("/light", 0) > 0
        header_spans = _spans_by_leaf(messages[seen:], big_header.pid)
        assert set(header_spans["spin_heavy"]) == {None}, header_spans  # no context read: no variable looked for
        assert contexts.stats["errors"] > errors
        assert all(r.get("service.name") != "liar" for r in resources_of(messages[seen:], big_header.pid))


@pytest.mark.bpf
def test_off_cpu_time_carries_the_span_it_was_spent_in(writers, tmp_path):
    """A thread that sleeps inside a span: its off-CPU time (read when it leaves the CPU) links
    to that span."""
    from pycollector.pdata import sample_type

    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": 99, "reporter_interval": "1s", "off_cpu_threshold": 1.0,
                                    "unwind_cache_dir": str(tmp_path / "cache")}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    payload = resource(service__name="sleeper", threadlocal__schema_version="tlsdesc_v1_dev", threadlocal__attribute_key_map=["http.route"])
    sleeper = subprocess.Popen([writers["tlsdesc, static"][0], "30"], stdout=subprocess.PIPE, text=True,
                               env={"OTEL_CTX_PAYLOAD": payload.hex(), "OTEL_CTX_SLEEP": "1"})
    try:
        sleeper.stdout.readline()
        time.sleep(5)
        by_message = []
        for message in capture.consumer.messages:
            waits: dict = {}
            for view in iter_samples(message):
                if view.resource.get("process.pid") == sleeper.pid and sample_type(message, view.profile)[0] == "off_cpu":
                    waits[view.link] = waits.get(view.link, 0) + sum(view.values)
            if waits:
                by_message.append(waits)
        # From the report after the one that first links a wait (the process is linked from the
        # agent's first look after it published), every wait is under the span.
        first = next(index for index, waits in enumerate(by_message) if waits.get((TRACE, HEAVY_SPAN)))
        assert first <= 2, by_message[:first + 1]  # linked within a report or two
        waits = {}
        for message_waits in by_message[first + 1:]:
            for link, value in message_waits.items():
                waits[link] = waits.get(link, 0) + value
        assert sum(waits.values()) > 1_000_000_000, waits  # over a second of sleep seen
        assert waits.get((TRACE, HEAVY_SPAN), 0) / sum(waits.values()) > 0.9, waits
    finally:
        sleeper.kill()
        sleeper.wait()
        service.shutdown()


@pytest.mark.bpf
def test_samples_sent_by_value_after_a_stack_collision_keep_their_span(writers, monkeypatch):
    """With a stack map of one entry most stacks collide and travel by value (the stack_overflow
    perf buffer): those samples carry the span their thread ran in too.  The by-value events are
    counted as the sampler receives them, for this process alone: how many of its samples collide
    depends on which stack holds the one bucket after each drain (the host's counter of received
    events says nothing about this process)."""
    from receivers.profiling.kernel.sampler import Sampler
    from tests.test_profiling_sampler import Profiler, require_bpf

    require_bpf()
    watched: dict = {}
    by_value: dict = {}
    receive = Sampler._on_overflow

    def counting(sampler, cpu, data, size):
        event = ctypes.cast(data, ctypes.POINTER(sampler._overflow_type)).contents
        if event.tgid == watched.get("pid"):
            span = bytes(event.span_id)
            by_value[span] = by_value.get(span, 0) + event.value
        receive(sampler, cpu, data, size)

    monkeypatch.setattr(Sampler, "_on_overflow", counting)  # before the perf buffer is opened
    profiler = Profiler(stack_storage_size=1)
    try:
        sampler = profiler.sampler
        process = subprocess.Popen([writers["local-exec"][0], "3"], stdout=subprocess.PIPE, text=True)
        watched["pid"] = process.pid
        fields = dict(part.split("=") for part in process.stdout.readline().split())
        sampler.set_thread_context(process.pid, int(fields["var"], 16) - int(fields["tp"], 16))
        spans: dict = {}
        while process.poll() is None:
            time.sleep(0.4)
            for stack in sampler.collect().stacks:
                if stack.tgid == process.pid:
                    spans[stack.span[16:] or None] = spans.get(stack.span[16:] or None, 0) + stack.count
    finally:
        process.kill()
        process.wait()
        profiler.close()
    total, sent_by_value = sum(spans.values()), sum(by_value.values())
    print(f"\n{sent_by_value} of {total} samples by value: {by_value}")
    assert sent_by_value >= 0.1 * total, (by_value, spans)  # the path under test was taken often
    assert (by_value.get(HEAVY_SPAN, 0) + by_value.get(LIGHT_SPAN, 0)) / sent_by_value > 0.95, by_value
    assert (spans.get(HEAVY_SPAN, 0) + spans.get(LIGHT_SPAN, 0)) / total > 0.95, spans
