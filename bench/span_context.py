"""What linking samples to spans costs (issue 26): in the kernel, and in the instrumented service.

BPF time per sample (the agent at HZ, one busy copy per CPU of the tests' C program that runs in
two spans, tests/native/otel_thread_ctx_main.c), in a rotated order each round:

publisher       the program publishes its process context and thread context (the TLS model:
                local-exec), so each sample reads the thread's record and keeps its span;
not publishing  the same program without a process context: the agent knows of no variable
                there, and a sample pays one map lookup.

Writer cost per span (the real OpenTelemetry SDK, no span processor, so that the figure is the
span's own cost: ``with tracer.start_as_current_span(...)``, an http.route attribute), and per
asyncio task switch (``await asyncio.sleep(0)`` in a task), in a subprocess each:

writer          pycollector's Python writer on (OTEL_PYTHON_CONTEXT=pycollector_thread_context);
sdk             the SDK as it comes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench import children, procfs, rounds
from bench.figures import Row, per_round
from bench.python_frames import measure_pycollector
from bench.rounds import Run
from bench.settings import Settings
from bench.sink import ProfilesSink

NATIVE = Path(__file__).resolve().parents[1] / "tests" / "native"
PUBLISHER, PLAIN = "publisher", "not publishing"
WRITER, SDK = "writer", "sdk"
SPANS = 20_000
SWITCHES = 50_000

TIMING = textwrap.dedent(f"""
    import asyncio, time
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("bench")

    def per_span():
        began = time.perf_counter()
        for _ in range({SPANS}):
            with tracer.start_as_current_span("GET /x", attributes={{"http.route": "/x"}}):
                pass
        return (time.perf_counter() - began) / {SPANS} * 1e9

    async def switches():
        began = time.perf_counter()
        for _ in range({SWITCHES}):
            await asyncio.sleep(0)
        return (time.perf_counter() - began) / {SWITCHES} * 1e9

    async def in_span():
        with tracer.start_as_current_span("task"):
            return await switches()

    per_span()  # (warm: the writer publishes and hooks at its first span)
    print(min(per_span() for _ in range(5)), min(asyncio.run(in_span()) for _ in range(3)))
""")


def build(workdir: Path) -> Path:
    binary = workdir / "otel_thread_ctx_main"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-rdynamic", "-o", str(binary), str(NATIVE / "otel_thread_ctx_main.c"),
                    str(NATIVE / "otel_thread_ctx.c"), "-ldl"], check=True)
    return binary


def _payload() -> str:
    """The publisher's process context: the resource as the Python writer (sdk/python) encodes it."""
    from pycollector_otel_context._resource import encode_resource

    return encode_resource({"service.name": "bench", "threadlocal.schema_version": "tlsdesc_v1_dev",
                            "threadlocal.attribute_key_map": ["http.route"]}).hex()


def run_bpf_rounds(settings: Settings, binary: Path, workdir: Path, sink: ProfilesSink) -> list[Run]:
    return rounds.rotated(settings.rounds, (PUBLISHER, PLAIN), workdir, "span context",
                          lambda mode, index, rundir: _run_bpf(mode, index, settings, binary, rundir, sink))


def _run_bpf(mode: str, index: int, settings: Settings, binary: Path, rundir: Path, sink: ProfilesSink) -> Run:
    from bench import peers

    seconds = peers.STARTUP_TIMEOUT_S + settings.settle_seconds + settings.workload_seconds
    env = {"OTEL_CTX_PAYLOAD": _payload()} if mode == PUBLISHER else {}
    copies = [children.start([str(binary), f"{seconds:g}"], stdout=subprocess.DEVNULL, env=env) for _ in range(procfs.online_cpus())]
    try:
        time.sleep(0.5)
        return measure_pycollector(index, settings, rundir, sink, mode=mode)
    finally:
        children.stop(*copies)


def run_writer_rounds(settings: Settings, workdir: Path) -> list[Run]:
    return rounds.rotated(settings.rounds, (WRITER, SDK), workdir, "python writer", _run_writer)


def _run_writer(mode: str, index: int, rundir: Path) -> Run:
    env = {**os.environ, "OTEL_PYTHON_CONTEXT": "pycollector_thread_context"} if mode == WRITER else \
        {key: value for key, value in os.environ.items() if key != "OTEL_PYTHON_CONTEXT"}
    timed = subprocess.run([sys.executable, "-c", TIMING], capture_output=True, text=True, env=env, check=True, timeout=600)
    span_ns, switch_ns = (float(word) for word in timed.stdout.split())
    return Run(mode, index, procfs.load_average(), {"ns_per_span": span_ns, "ns_per_switch": switch_ns})


def rows(bpf_runs: list[Run], writer_runs: list[Run]) -> list[Row]:
    section = "Span context"
    return [
        Row(section, "BPF run time per sample, ns (bpf_stats), the sampled program publishing its spans",
            per_round(bpf_runs, PUBLISHER, "bpf_ns_per_sample"), PLAIN, per_round(bpf_runs, PLAIN, "bpf_ns_per_sample"), "{:.0f}"),
        Row(section, "Python: a span started and ended, ns (SDK, no span processor)", per_round(writer_runs, WRITER, "ns_per_span"),
            "SDK without the writer", per_round(writer_runs, SDK, "ns_per_span"), "{:.0f}"),
        Row(section, "Python: an asyncio task switch inside a span, ns", per_round(writer_runs, WRITER, "ns_per_switch"),
            "SDK without the writer", per_round(writer_runs, SDK, "ns_per_switch"), "{:.0f}"),
    ]
