"""Real agent reports for the pipeline bench: what the profiling receiver sends a gateway.

``python -m bench.agent_reports capture [--seconds 120]`` (root: BPF) makes this host busy with one
copy of each known workload (C, Rust, Go, Node, Java, and the Python one, two threads, under each
of pyenv's CPython 3 versions) beside whatever else runs,
profiles it with the profiling receiver as `configs/default.yaml` sets it (20 samples a second,
a report every 5 s) exporting OTLP/gRPC to a sink, and keeps every report the sink got in
``bench/agent_reports.bin.zst``: each request length-prefixed (4 bytes, big-endian), the whole
zstd-compressed. ``load()`` reads them back for the pipeline bench.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
import zstandard

from bench import children, workload
from bench.python_frames import PYENV
from bench.workload import WORKLOADS
from bench.sink import ProfilesSink

REPORTS = Path(__file__).resolve().with_name("agent_reports.bin.zst")
PYCOLLECTOR = Path(sys.executable).with_name("pycollector")


def load(path: Path = REPORTS) -> list[bytes]:
    """The kept reports, each a serialized ExportProfilesServiceRequest."""
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())).read()
    reports, position = [], 0
    while position < len(raw):
        length = int.from_bytes(raw[position : position + 4], "big")
        reports.append(raw[position + 4 : position + 4 + length])
        position += 4 + length
    return reports


def _save(reports: list[bytes], path: Path) -> None:
    framed = b"".join(len(report).to_bytes(4, "big") + report for report in reports)
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(framed))


def busy_host(workdir: Path, seconds: float, every_runtime: bool = True) -> list[subprocess.Popen]:
    """One copy of each workload, each running ``seconds``; without ``every_runtime``, the C
    workload alone, a copy per CPU (the quick bench's smoke run)."""
    built = workdir / "bin"
    built.mkdir(exist_ok=True)
    known_split_c = workload.build_known_split(built)
    if not every_runtime:
        return [children.start([str(known_split_c), str(seconds)], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 1)]
    compile_steps = [
        ["rustc", "-O", "-o", str(built / "known_split_rs"), str(WORKLOADS / "known_split.rs")],
        ["go", "build", "-o", str(built / "known_split_go"), str(WORKLOADS / "known_split.go")],
        ["javac", "-d", str(built), str(WORKLOADS / "KnownSplit.java")],
    ]
    env = {**os.environ, "GOCACHE": str(workdir / "gocache"), "GOPATH": str(workdir / "gopath")}
    for step in compile_steps:
        subprocess.run(step, check=True, env=env, cwd=workdir, capture_output=True)
    pythons = sorted(PYENV.glob("3.*/bin/python3"))
    commands = [
        [str(known_split_c), str(seconds)],
        [str(built / "known_split_rs"), str(seconds)],
        [str(built / "known_split_go"), str(seconds)],
        *[[str(python), str(WORKLOADS / "known_split.py"), str(seconds), "2"] for python in pythons],
        [shutil.which("node") or "node", str(WORKLOADS / "known_split.js"), str(seconds)],
        [shutil.which("java") or "java", "-cp", str(built), "KnownSplit", str(seconds)],
    ]
    return [children.start(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for command in commands]


def capture(seconds: float, path: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="pycollector-reports-") as scratch, ProfilesSink(keep_requests=True) as sink:
        workdir = Path(scratch)
        config = {
            "receivers": {"profiling": {"samples_per_second": 20, "reporter_interval": "5s"}},
            "exporters": {"otlp_grpc": {"endpoint": sink.endpoint, "tls": {"insecure": True}, "compression": "none"}},
            "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["otlp_grpc"]}}},
        }
        (workdir / "agent.yaml").write_text(yaml.safe_dump(config))
        workloads = busy_host(workdir, seconds + 15)
        agent = children.start([str(PYCOLLECTOR), "--config", str(workdir / "agent.yaml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(seconds)
        finally:
            children.stop(agent)
            children.stop(*workloads)
        reports = sink.take()
    # The first report holds the agent's start-up, not a steady interval.
    _save(reports[1:], path)
    print(f"bench: kept {len(reports) - 1} agent reports in {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_reports", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["capture"])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--output", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    return capture(args.seconds, args.output)


if __name__ == "__main__":
    sys.exit(main())
