"""`pycollector diff BASE AFTER`: what changed between two profiles, function by function.

BASE and AFTER are pprof files (ours, or any `go tool pprof` reads) or OTLP profile files (the
`file` exporter's JSON lines or protobuf). Shares are each side's own (a longer window does not
weigh more); a change within the sampling noise of the two sides' counts is marked ``~``.
"""

from __future__ import annotations

import argparse
import sys

from exporters.flamegraph.compare import Side, compare, read_stacks


class DiffCommand:
    name = "diff"
    help = "compare two profiles (pprof or OTLP files): the functions that cost more, and less"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("base", metavar="BASE", help="the profile before (pprof, or OTLP JSON/proto)")
        parser.add_argument("after", metavar="AFTER", help="the profile after")
        parser.add_argument("--type", default=None, help="sample type (default: CPU samples, or the file's default)")
        parser.add_argument("--process", default=None, help="OTLP files: one process's samples (pid, executable name or service.name)")
        parser.add_argument("--top", type=int, default=10, help="functions listed each way (default 10)")

    def run(self, args: argparse.Namespace) -> int:
        sides = []
        for path in (args.base, args.after):
            try:
                stacks, value_type, counts = read_stacks(path, args.type, args.process)
            except (OSError, ValueError) as error:
                print(f"pycollector diff: {path}: {error}", file=sys.stderr)
                return 1
            sides.append(Side.of(stacks, counts))
        base, after = sides
        changes = compare(base, after)
        print(f"base: {base.total} ({args.base})   after: {after.total} ({args.after})   type: {value_type}")
        print(f"{'self Δ':>8} {'base':>7} {'after':>7} {'total Δ':>8}  function   (~: within sampling noise)")
        increases = [change for change in changes if change.self_change > 0][: args.top]
        decreases = [change for change in reversed(changes) if change.self_change < 0][: args.top]
        for title, rows in (("costs more", increases), ("costs less", decreases)):
            print(title)
            for change in rows:
                mark = "~" if change.noise else " "
                print(f"{100 * change.self_change:+7.1f}%{mark}{100 * change.base_self:6.1f}% {100 * change.after_self:6.1f}% "
                      f"{100 * change.total_change:+7.1f}%  {change.function}")
        return 0


command = DiffCommand()
