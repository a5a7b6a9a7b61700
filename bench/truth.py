"""Whether a profile tells the truth, read from what each profiler produced:

- spin_heavy's share of known_split's samples (the workload does 3 parts spin_heavy to 1 part
  spin_light, so about 0.75), by the leaf frame of each sample of the workload's processes;
- the share of samples, over the whole host, whose every user frame has a name (among samples
  that have user frames: a kernel thread's sample has none to name). The profilers' own
  processes are left out: each sees the other's start and stop, never its own.

Both profiled the same rounds side by side (bench.side_by_side). pycollector's side is the OTLP
it exported (weighted by each sample's count); perf's side is `perf script` of its perf.data (one
record per sample).
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import iter_samples

from bench.figures import Row, per_round
from bench.peers import PerfRecord, PycollectorAgent
from bench.perf_script import PerfSample

HEAVY = "spin_heavy"
KERNEL_FRAME = "kernel"


def exported_samples(requests: Iterable[bytes]) -> Iterable[tuple[int, list, int]]:
    """(pid, frames leaf first, count) of every sample in the exported requests."""
    for request in requests:
        for view in iter_samples(profiles_pb2.ProfilesData.FromString(request)):
            yield view.resource.get("process.pid"), view.frames, sum(view.values)


def heavy_share_exported(requests: list[bytes], pids: list[int]) -> float:
    heavy = total = 0
    for pid, frames, count in exported_samples(requests):
        if pid in pids:
            total += count
            heavy += count if frames and frames[0].function == HEAVY else 0
    return heavy / total if total else float("nan")


def heavy_share_perf(samples: list[PerfSample], pids: list[int]) -> float:
    mine = [sample for sample in samples if sample.pid in pids]
    heavy = sum(1 for sample in mine if sample.frames and sample.frames[0].symbol == HEAVY)
    return heavy / len(mine) if mine else float("nan")


def named_share_exported(requests: list[bytes], left_out: list[int]) -> float:
    named = total = 0
    for pid, frames, count in exported_samples(requests):
        user = [frame for frame in frames if frame.frame_type != KERNEL_FRAME]
        if user and pid not in left_out:
            total += count
            named += count if all(frame.function for frame in user) else 0
    return named / total if total else float("nan")


def named_share_perf(samples: list[PerfSample], left_out: list[int]) -> float:
    named = total = 0
    for sample in samples:
        user = [frame for frame in sample.frames if frame.user]
        if sample.pid and user and sample.pid not in left_out:  # pid 0 is the idle task
            total += 1
            named += all(frame.named for frame in user)
    return named / total if total else float("nan")


def rows(runs: list) -> list[Row]:
    ours, perf = PycollectorAgent.name, PerfRecord.name
    return [
        Row("Truth", "spin_heavy's share of known_split's samples (0.75 by construction)", per_round(runs, ours, "heavy_share"), perf, per_round(runs, perf, "heavy_share"), "{:.3f}"),
        Row("Truth", "Host samples whose every user frame has a name", per_round(runs, ours, "named_share"), perf, per_round(runs, perf, "named_share"), "{:.3f}"),
    ]
