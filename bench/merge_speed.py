"""What merging profiles costs, per payload, against decoding and encoding the same payload.

``python -m bench.merge_speed [--runs N] [--interning]``: builds the pipeline bench's payloads
(bench/payloads.py) and times, each N times (the median is printed, with the spread):

- decode+encode: parse and serialize one payload, the pipeline bench's peer;
- append: ``appending.append`` of a payload into a batch that holds one to three others (what the
  batch processor does for the 2nd to 4th message of a batch);
- append, line numbers: the same with a line number on each location and every fifth location
  inlined (two lines), which takes the slower way for lines;
- check: ``appending.check``, what the batch pays for the message it starts with;
- the batch: four payloads through ``Pending`` (check, copy, three appends) and one cut;
- interning (``--interning``, slow): ``ProfilesBuilder.merge``, the re-interning merge.

Runs in one process on a quiet core or not at all: the figures are for comparing changes, and the
host's load moves them (the machine this was written on drifts by a third).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import payloads
from pycollector.pdata import ProfilesBuilder, appending, sample_count
from processors.batch.pending import Pending

BATCH = 4


def _timed(runs: int, setup: Callable[[], object], work: Callable[[object], object]) -> list[float]:
    seconds = []
    for _ in range(runs):
        state = setup()
        began = time.perf_counter()
        work(state)
        seconds.append(time.perf_counter() - began)
    return seconds


def _row(name: str, seconds: list[float], per: int = 1) -> None:
    ms = sorted(s * 1000 / per for s in seconds)
    print(f"{name:34s} median {statistics.median(ms):8.2f} ms   min {ms[0]:8.2f}   max {ms[-1]:8.2f}")


def _copy(message: profiles_pb2.ProfilesData) -> profiles_pb2.ProfilesData:
    copy = profiles_pb2.ProfilesData()
    copy.CopyFrom(message)
    return copy


def _with_line_numbers(message: profiles_pb2.ProfilesData) -> profiles_pb2.ProfilesData:
    message = _copy(message)
    for number, location in enumerate(message.dictionary.location_table):
        if location.lines:
            location.lines[0].line = 1 + location.address % 997
            if number % 5 == 0:
                location.lines.add(function_index=location.lines[0].function_index, line=3)
    return message


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.merge_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--interning", action="store_true", help="also time ProfilesBuilder.merge (about 0.2 s a payload)")
    args = parser.parse_args(argv)
    messages = [payloads.build(seed) for seed in range(BATCH)]
    first = messages[0]
    d = first.dictionary
    print(
        f"payload: {sample_count(first)} samples, {len(first.SerializeToString()) // 1024} KiB; dictionary: "
        f"{len(d.string_table)} strings, {len(d.function_table)} functions, {len(d.mapping_table)} mappings, "
        f"{len(d.location_table)} locations, {len(d.stack_table)} stacks of {sum(len(s.location_indices) for s in d.stack_table)} locations"
    )
    encoded = messages[1].SerializeToString()
    _row("decode+encode", _timed(args.runs, lambda: None, lambda _: profiles_pb2.ProfilesData.FromString(encoded).SerializeToString()))

    def append_all(others: list[profiles_pb2.ProfilesData]) -> Callable[[object], None]:
        def work(batch: object) -> None:
            for message in others:
                appending.append(batch, message)

        return work

    _row("append", _timed(args.runs, lambda: _copy(first), append_all(messages[1:])), per=BATCH - 1)
    numbered = [_with_line_numbers(message) for message in messages]
    _row("append, line numbers", _timed(args.runs, lambda: _copy(numbered[0]), append_all(numbered[1:])), per=BATCH - 1)
    _row("check", _timed(args.runs, lambda: None, lambda _: appending.check(messages[1])))

    def batch(_: object) -> None:
        pending = Pending("profiles")
        for message in messages:
            pending.add(message)
        pending.cut(pending.count)

    _row(f"the batch ({BATCH} payloads), per payload", _timed(args.runs, lambda: None, batch), per=BATCH)
    if args.interning:
        _row("interning (ProfilesBuilder.merge)", _timed(max(1, args.runs // 3), ProfilesBuilder, lambda b: [b.merge(m) for m in messages]), per=BATCH)


if __name__ == "__main__":
    main()
