"""pycollector's Python writer (sdk/python): what an instrumented service shows a profiler.

The application (tests/python_context_writer.py) uses the real OpenTelemetry SDK with the writer
switched on by one environment variable; what it publishes is read from outside with the
profiling receiver's own readers (process memory, the process context decoder, the thread
record's attribute parser), as the agent reads it. The end-to-end checks with BPF are in
test_python_spans.py.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.proto.resource.v1 import resource_pb2

from receivers.profiling.otel_context.process_context import read_process_context
from receivers.profiling.otel_context.thread_context import parse_attributes
from receivers.profiling.processes.memory import ProcessMemory
from receivers.profiling.processes.proc import find_process_context

pytest.importorskip("pycollector_otel_context", reason="the writer is installed by `make setup` (pip install ./sdk/python)")

from pycollector_otel_context._resource import encode_resource  # noqa: E402

APP = Path(__file__).with_name("python_context_writer.py")
RECORD = struct.Struct("=16s8sBBH")  # trace id, span id, valid, trace flags, attrs-data size
# The CPythons the writer supports: this venv's, and pyenv's 3.8 to 3.13 where the host has them.
INTERPRETERS = ["venv"] + [f"3.{minor}" for minor in range(8, 14)]


@pytest.fixture(scope="session")
def sites(sdk_pythons):
    """Per CPython: (its python, the environment to add) with the writer installed as pip installs
    it, beside the OpenTelemetry SDK release pip picks for it (1.33 for 3.8): pyenv's through
    conftest's sdk_pythons (shared with the heap sampler's tests), "venv" this one."""

    def site(version: str) -> tuple[str, dict]:
        return (sys.executable, {}) if version == "venv" else (str(sdk_pythons(version)), {})

    return site


def writer_env(extra: dict | None = None) -> dict:
    return {**os.environ, "OTEL_PYTHON_CONTEXT": "pycollector_thread_context", "PYCOLLECTOR_CONTEXT_ATTRIBUTES": "http.route",
            "OTEL_SERVICE_NAME": "from-env", **(extra or {})}


class App:
    def __init__(self, python: str = sys.executable, env: dict | None = None):
        self.process = subprocess.Popen([python, str(APP), "steps"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=writer_env(env))
        self.memory = ProcessMemory(self.process.pid)

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def context(self):
        with open(f"/proc/{self.process.pid}/maps") as maps:
            address = find_process_context(maps.read())
        assert address is not None, "no OTEL_CTX region in its maps"
        return read_process_context(self.memory, address)

    def record(self, variable: int) -> tuple | None:
        """What a reader finds through the thread's otel_thread_ctx_v1."""
        pointer = self.memory.u64(variable)
        if pointer == 0:
            return None
        trace_id, span_id, valid, flags, size = RECORD.unpack(self.memory.read(pointer, RECORD.size))
        return trace_id, span_id, valid, flags, self.memory.read(pointer + RECORD.size, size) if size else b""

    def close(self):
        self.process.kill()
        self.process.wait()
        self.memory.close()


@pytest.fixture(params=INTERPRETERS)
def app(request, sites):
    application = App(*sites(request.param))
    yield application
    application.close()


def test_the_resource_encoding_is_what_protobuf_decodes():
    attributes = {"service.name": "checkout ✓", "replicas": 3, "negative": -2, "ratio": 0.5, "canary": True,
                  "threadlocal.attribute_key_map": ["http.route", "user"]}
    decoded = resource_pb2.Resource.FromString(encode_resource(attributes))
    values = {pair.key: pair.value for pair in decoded.attributes}
    assert values["service.name"].string_value == "checkout ✓"
    assert values["replicas"].int_value == 3 and values["negative"].int_value == -2
    assert values["ratio"].double_value == 0.5 and values["canary"].bool_value is True
    assert [v.string_value for v in values["threadlocal.attribute_key_map"].array_value.values] == ["http.route", "user"]


def test_the_process_context_is_the_sdks_resource_and_the_key_map(app):
    app.ask("start /checkout")
    context = app.context()
    assert context.attributes["service.name"] == "writer-test" and context.attributes["service.version"] == "7"
    assert context.attributes["telemetry.sdk.language"] == "python"
    assert context.schema_version == "tlsdesc_v1_dev" and context.key_map == ("http.route",)


def test_the_process_context_is_there_before_the_first_span_and_follows_the_sdk(sites):
    """Published when the SDK loads its runtime context, from the environment (so a profiler
    finds the process and its variable before any span); the tracer provider's resource
    replaces it at the first span, by the update protocol."""
    app = App(*sites("venv"))
    try:
        app.process.stdin.write("ready\n")
        app.process.stdin.flush()
        assert app.process.stdout.readline().strip() == "ready"
        early = app.context()
        assert early.attributes.get("service.name") == "from-env" and early.schema_version == "tlsdesc_v1_dev"
        app.ask("start /first")
        later = app.context()
        assert later.attributes["service.name"] == "writer-test" and later.published_at_ns > early.published_at_ns
    finally:
        app.close()


def test_the_thread_record_follows_the_span_and_its_route(app):
    """Started: the record holds the span's ids and route; a route set later shows; ended:
    the variable is cleared."""
    trace_hex, span_hex, variable = app.ask("start /users/{id}").split()
    variable = int(variable, 16)
    trace_id, span_id, valid, flags, attrs = app.record(variable)
    assert (trace_id.hex(), span_id.hex(), valid, flags & 1) == (trace_hex, span_hex, 1, 1)  # (sampled; newer SDKs add "random")
    key_map = app.context().key_map
    assert parse_attributes(attrs, key_map)[0] == {"http.route": "/users/{id}"}
    assert app.ask("route /users/{id}/orders") == "ok"
    assert parse_attributes(app.record(variable)[4], key_map)[0] == {"http.route": "/users/{id}/orders"}
    assert app.ask("end") == "ok"
    assert app.record(variable) is None
    second_trace, second_span, _ = app.ask("start /second").split()
    assert app.record(variable)[:2] == (bytes.fromhex(second_trace), bytes.fromhex(second_span))


def test_a_forked_child_publishes_a_context_of_its_own(app):
    app.ask("start /parent")
    parent = app.context()
    app.process.stdin.write("fork\n")
    app.process.stdin.flush()
    lines = [app.process.stdout.readline().split() for _ in range(2)]  # "forked", and the child's "child PID"
    # (ci20 read two lines neither of which was the child's, once, on 3.9 beside the other tests:
    # what they were is in the message next time)
    children = [line for line in lines if line[:1] == ["child"]]
    assert children, lines
    child_pid = int(children[0][1])
    try:
        with open(f"/proc/{child_pid}/maps") as maps:
            address = find_process_context(maps.read())
        assert address is not None, "the child has no context of its own"
        with ProcessMemory(child_pid) as memory:
            child = read_process_context(memory, address)
        assert child.attributes["service.name"] == "writer-test" and child.published_at_ns > parent.published_at_ns
    finally:
        os.kill(child_pid, signal.SIGKILL)  # (the app's child, not ours: reaped by init once the app is gone)


@pytest.mark.parametrize("version", INTERPRETERS)
def test_asyncio_tasks_each_see_their_own_span_at_every_turn(sites, version):
    """Three tasks take turns on one loop (two in spans of their own, one in none): at every
    turn the thread's record holds the span of the task that runs."""
    python, env = sites(version)
    result = subprocess.run([python, str(APP), "asyncio"], capture_output=True, text=True, env=writer_env(env), timeout=60)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    turns, mismatches = int(words[1]), int(words[3])
    assert turns == 901 and mismatches == 0, result.stdout
