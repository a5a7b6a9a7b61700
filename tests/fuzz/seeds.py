"""The seed corpus: real inputs for each target, written by ``python -m tests.fuzz seeds``.

- ``otlp_decode``: traces, metrics and logs requests as the OpenTelemetry SDK's OTLP exporters
  encode them (the SDK's own encoders, which its gRPC and HTTP exporters both call, over spans,
  metrics and log records the SDK recorded), and profiles as our exporters encode them in each
  profiles.proto layout; each as protobuf and JSON, identity and gzip, deflate and zstd,
  Content-Length and chunked, and over gRPC.
- ``config``: the configs of ``configs/`` and ``tests/testdata/``, some with ``--set`` flags,
  environment variables, an override file and a ``${file:...}`` secret.
- ``profiles_append_split``: pairs of serialized ProfilesData, from the profiles above.
- ``profiles_merge_split``: hypothesis buffers for valid examples of its strategy (their meaning
  depends on the hypothesis version and the strategy, so they are written again when these change).
- the profiling receiver's parsers (``parser_targets``): small programs gcc builds here (with and
  without symbols, frame pointers, PIE) for ``elf_file``; their ``.eh_frame`` and ``.debug_frame``
  and libc's first records for ``eh_frame``; the start of a Go program's ``.gopclntab``; perf map
  lines as Node.js and HotSpot write them; line tables of every pyenv CPython's code objects; the
  ``_Py_DebugOffsets`` of CPython 3.13.

Files named ``seed-*`` are written here and replaced on each run; any other file (``crash-*``,
an input the fuzzer found that failed once, kept so that it stays fixed) is left alone.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from pathlib import Path

import zstandard
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.otlp import profiles_wire
from pycollector.otlp.json_codec import to_json
from pycollector.pdata import ProfilesBuilder
from pycollector.testing import sample_data
from tests.fuzz.targets import OtlpCase, chunk, compress, profiles_merge_split

ROOT = Path(__file__).resolve().parents[2]


def sdk_requests() -> dict[str, bytes]:
    """One Export request of each signal the SDK exports, as its OTLP exporters send it."""
    from opentelemetry._logs import SeverityNumber
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    resource = Resource.create({"service.name": "checkout", "deployment.environment": "fuzz"})

    spans = InMemorySpanExporter()
    tracers = TracerProvider(resource=resource)
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracers.get_tracer("seeds", "1.0")
    with tracer.start_as_current_span("GET /cart", attributes={"http.method": "GET", "http.status_code": 200}):
        with tracer.start_as_current_span("SELECT cart") as child:
            child.add_event("cache miss", {"key": "cart:42", "ratio": 0.5, "tags": ["a", "b"]})
    tracers.shutdown()

    reader = InMemoryMetricReader()
    meters = MeterProvider(resource=resource, metric_readers=[reader])
    meter = meters.get_meter("seeds")
    meter.create_counter("requests").add(5, {"route": "/cart"})
    meter.create_histogram("latency", unit="ms").record(12.5, {"route": "/cart"})
    meter.create_up_down_counter("in_flight").add(-2)
    meter.create_gauge("temperature").set(21.5)
    metrics = reader.get_metrics_data()
    meters.shutdown()

    records = InMemoryLogRecordExporter()
    loggers = LoggerProvider(resource=resource)
    loggers.add_log_record_processor(SimpleLogRecordProcessor(records))
    loggers.get_logger("seeds").emit(body="disk almost full", severity_number=SeverityNumber.WARN, attributes={"disk": "/dev/sda1", "free": 0.03})
    loggers.shutdown()

    return {
        "traces": encode_spans(spans.get_finished_spans()).SerializeToString(),
        "metrics": encode_metrics(metrics).SerializeToString(),
        "logs": encode_logs(records.get_finished_logs()).SerializeToString(),
    }


def a_profile() -> profiles_pb2.ProfilesData:
    """Native and Python frames, inlined lines, a mapping with a build id, links, two resources."""
    builder = ProfilesBuilder()
    libc = builder.mapping(0x7F00_0000_0000, 0x7F00_0020_0000, 0x1000, "/usr/lib/libc.so.6", {"process.executable.build_id.gnu": "a1b2c3"})
    main = builder.location(0, 0x401000, [(builder.function("main", filename="main.c"), 10, 3)], {"profile.frame.type": "native"})
    inlined = builder.location(libc, 0x7F00_0001_2345, [(builder.function("memcpy"), 0, 0), (builder.function("__libc_write"), 88, 0)], {"profile.frame.type": "native"})
    python = builder.location(0, 0, [(builder.function("handle", "app.handle", "/srv/app.py", 40), 42, 8)], {"profile.frame.type": "python"})
    link = builder.link(bytes(range(16)), bytes(range(8)))
    for pid in (4242, 4343):
        resource = builder.resource_profiles({"process.pid": pid, "host.name": "node-1", "k8s.pod.labels": ["app=shop", "tier=web"]})
        profile = builder.profile(builder.scope_profiles(resource, name="pycollector", version="0.1.0"), period=50_000_000, time_unix_nano=1_700_000_000_000_000_000, duration_nano=5_000_000_000, attributes={"profile.id": "x"}, profile_id=bytes([pid & 0xFF] * 16))
        builder.sample(profile, builder.stack([inlined, main]), [3], attributes={"thread.id": pid, "thread.name": "worker"}, timestamps_unix_nano=[1_700_000_000_000_000_001])
        builder.sample(profile, builder.stack([python, main]), [1], link_index=link)
    return builder.data


def _name(data: bytes) -> str:
    return "seed-" + hashlib.sha1(data).hexdigest()[:12]


def otlp_seeds() -> list[bytes]:
    bodies = {signal: (proto, to_json(_parse(signal, proto))) for signal, proto in sdk_requests().items()}
    profiles = sample_data("profiles"), a_profile()
    bodies["profiles"] = tuple(profiles_wire.encode(profiles[1], encoding, profiles_wire.CURRENT) for encoding in ("proto", "json"))
    seeds = []
    for signal, (proto, json) in bodies.items():
        case = dict(signal=signal, json=False, content_encoding="", raw=False, chunked=False, grpc=False, layout="auto", chunk_size=1)
        seeds += [
            OtlpCase(**case, payload=proto),
            OtlpCase(**{**case, "content_encoding": "gzip", "chunked": True, "chunk_size": 98}, payload=proto),
            OtlpCase(**{**case, "json": True}, payload=json),
            OtlpCase(**{**case, "json": True, "content_encoding": "zstd", "raw": True}, payload=compress(json, "zstd")),
            OtlpCase(**{**case, "content_encoding": "deflate", "raw": True, "chunked": True}, payload=chunk(zlib.compress(proto), 64)),
            OtlpCase(**{**case, "grpc": True}, payload=proto),
        ]
    # Profiles in the layouts older senders write, recognized and named in the receiver's config.
    profile = dict(signal="profiles", content_encoding="", raw=False, chunked=False, chunk_size=1)
    for version in ("1.8", "1.9"):
        layout = profiles_wire.LAYOUTS[version]
        for data in profiles:
            proto = profiles_wire.encode(data, "proto", layout)
            seeds += [OtlpCase(**profile, json=False, grpc=False, layout="auto", payload=proto), OtlpCase(**profile, json=False, grpc=True, layout=version, payload=proto)]
        seeds.append(OtlpCase(**profile, json=True, grpc=False, layout="auto", payload=profiles_wire.encode(profiles[1], "json", layout)))
    # A zstd body of two frames, and a gzip body of two members.
    seeds.append(OtlpCase(**{**profile, "content_encoding": "zstd", "raw": True}, json=False, grpc=False, layout="auto", payload=compress(b"", "zstd") + compress(bodies["profiles"][0], "zstd")))
    seeds.append(OtlpCase(**{**profile, "content_encoding": "gzip", "raw": True}, json=False, grpc=False, layout="auto", payload=compress(bodies["profiles"][0][:50], "gzip") + compress(bodies["profiles"][0][50:], "gzip")))
    return [seed.to_bytes() for seed in seeds]


def _parse(signal: str, proto: bytes):
    from pycollector.otlp import OTLP_SIGNALS

    return OTLP_SIGNALS[signal].data_type.FromString(proto)


def config_seeds() -> list[bytes]:
    files = sorted(
        [*ROOT.glob("configs/*.yaml"), *ROOT.glob("tests/testdata/config/*.yaml"), *ROOT.glob("tests/testdata/otlp/*.yaml"), *ROOT.glob("tests/testdata/cli/*.yaml"), *ROOT.glob("tests/testdata/processors/*.yaml")]
    )
    seeds = [path.read_bytes() for path in files]
    default, gateway = (ROOT / "configs/default.yaml").read_bytes(), (ROOT / "tests/testdata/otlp/go_gateway.yaml").read_bytes()
    seeds.append(
        b"\0".join([default, b"", b"exporters::debug::verbosity=detailed\nservice.telemetry.logs.level=debug", b"PYCOLLECTOR_SAMPLES_PER_SECOND=50\nPYCOLLECTOR_REPORTER_INTERVAL=1m30s\nPYCOLLECTOR_HEALTH_ENDPOINT="])
    )
    override = b"exporters:\n  otlphttp/backup:\n    headers:\n      authorization: ${file:@DIR@/f0}\n      x-tenant: ${env:TENANT:-acme}\n    timeout: ${TIMEOUT}\n"
    seeds.append(b"\0".join([gateway, override, b"receivers::otlp::protocols::grpc::endpoint=127.0.0.1:0\nexporters.otlp.compression=zstd", b"TENANT=shop\nTIMEOUT=5s", b"Bearer s3cr3t\n"]))
    return seeds


def append_split_seeds() -> list[bytes]:
    small, rich = sample_data("profiles").SerializeToString(), a_profile().SerializeToString()
    bare = profiles_pb2.ProfilesData()  # no dictionary at all: index 0 still means "none"
    bare.resource_profiles.add().scope_profiles.add().profiles.add().samples.add(values=[7])
    pairs = [(small, rich), (rich, rich), (b"", small), (bare.SerializeToString(), rich)]
    return [len(first).to_bytes(2, "big") + first + second for first, second in pairs]


def merge_split_seeds(count: int = 6) -> list[bytes]:
    """Buffers that replay as valid examples, from random ones (fuzz_one_input prunes them)."""
    chooser, seeds = random.Random(15), []
    while len(seeds) < count:
        replay = profiles_merge_split.hypothesis.fuzz_one_input(chooser.randbytes(4096))
        if replay is not None and len(replay) > 200:
            seeds.append(replay)
    return seeds


def write_all(corpus: Path) -> None:
    from tests.fuzz.parser_seeds import parser_seeds

    for target, seeds in {
        "otlp_decode": otlp_seeds(),
        "config": config_seeds(),
        "profiles_append_split": append_split_seeds(),
        "profiles_merge_split": merge_split_seeds(),
        **parser_seeds(),
    }.items():
        directory = corpus / target
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("seed-*"):
            old.unlink()
        for seed in seeds:
            (directory / _name(seed)).write_bytes(seed)
        print(f"{directory}: {len(seeds)} seeds")
