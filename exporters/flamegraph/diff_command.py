"""`pycollector diff BASE AFTER`: what changed between two profiles, function by function.

BASE and AFTER are pprof files (ours, or any `go tool pprof` reads) or OTLP profile files (the
`file` exporter's JSON lines or protobuf), of one sample type (two files whose defaults differ are
refused until ``--type`` names one). Shares are each side's own (a longer window does not weigh
more); a change within the sampling noise of the two sides' counts is marked ``~``. Each function
is listed by its self change, or by its total change where the function's own calls moved it (a
caller that now calls an expensive helper more often: compare.py says how), the row saying which.
For a process with Python, Java or JavaScript frames a function's self time is its innermost
frame of that language (as the page counts it); a pprof file's functions are a language's by
their file's suffix (``.py``, ``.java``, ``.js``...). ``-o diff.html`` writes the diff flame graph as a page that
opens anywhere: the flame graph page, opened on the comparison of the two files.

One OTLP file holding both sides (two versions that ran in turn under one collector) is compared
with itself: ``pycollector diff f.json f.json --base-where service.version=1 --after-where
service.version=2``.

Memory: ``--type inuse_space`` compares the live heap of two times (a leak is in-use growth), by
value, each side being each process's latest reading in its file; ``alloc_space`` what was
allocated, by share; functions are allocation sites. A file of memory profiles alone opens on
``inuse_space`` (``alloc_space`` without the live heap), as ``go tool pprof`` opens a heap profile.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from pycollector.pdata import is_memory, is_snapshot

from exporters.debug.values import describe_total, format_value
from exporters.flamegraph.compare import Change, Side, compare, decreases, increases, kept_apart, read_stacks

# The headings of the two lists, as the page words them (assets/units.js).
ALLOCATES, HOLDS, COSTS = ("allocates more", "allocates less"), ("holds more", "holds less"), ("costs more", "costs less")
HEADINGS = {"alloc_objects": ALLOCATES, "alloc_space": ALLOCATES, "inuse_objects": HOLDS, "inuse_space": HOLDS,
            "threads": ("more threads sit in", "fewer threads sit in"), "goroutines": ("more goroutines sit in", "fewer goroutines sit in")}


def _attribute(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE (a resource attribute, e.g. service.version=1.4)")
    return key, value


class DiffCommand:
    name = "diff"
    help = "compare two profiles (pprof or OTLP files): the functions that cost more, and less"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("base", metavar="BASE", help="the profile before (pprof, or OTLP JSON/proto)")
        parser.add_argument("after", metavar="AFTER", help="the profile after")
        parser.add_argument("--type", "--sample-type", dest="type", default=None,
                            help="sample type: samples, off_cpu, lock_wait, lock_wake, io_wait, inuse_space, alloc_space... (default: CPU samples; "
                                 "in-use bytes for memory alone; a pprof file's default)")
        parser.add_argument("--process", default=None, help="OTLP files: one process's samples (pid, executable name or service.name)")
        parser.add_argument("--where", type=_attribute, action="append", default=[], metavar="KEY=VALUE",
                            help="OTLP files: samples whose resource has this attribute value, both sides (repeatable)")
        parser.add_argument("--base-where", type=_attribute, action="append", default=[], metavar="KEY=VALUE", help="the same, for BASE only")
        parser.add_argument("--after-where", type=_attribute, action="append", default=[], metavar="KEY=VALUE", help="the same, for AFTER only")
        parser.add_argument("--top", type=int, default=10, help="functions listed each way (default 10)")
        parser.add_argument("-o", "--output", default=None, metavar="FILE.html", help="also write the diff flame graph as a self-contained page")

    def run(self, args: argparse.Namespace) -> int:
        stacks_of, value_types = [], []
        for path, own_where in ((args.base, args.base_where), (args.after, args.after_where)):
            try:
                stacks, value_type, counts = read_stacks(path, args.type, args.process, dict(args.where + own_where))
            except (OSError, ValueError) as error:
                print(f"pycollector diff: {path}: {error}", file=sys.stderr)
                return 1
            stacks_of.append(stacks)
            value_types.append(value_type)
        if value_types[0] != value_types[1]:
            why = "each its default: say which type to compare with --type" if args.type is None else "one type in two units: not comparable"
            print(f"pycollector diff: {args.base} holds {'/'.join(value_types[0])} and {args.after} {'/'.join(value_types[1])} ({why})",
                  file=sys.stderr)
            return 1
        base, after = (Side.of(stacks, counts) for stacks in kept_apart(*stacks_of))
        levels = is_snapshot(value_type)
        changes = compare(base, after, levels)
        if is_memory(value_type) or levels:
            print(f"base: {describe_total(base.total, value_type)} ({args.base})   after: {describe_total(after.total, value_type)} ({args.after})   "
                  f"type: {value_type[0]}")
        else:
            unit = "samples" if counts else value_type[1]
            print(f"base: {base.total} {unit} ({args.base})   after: {after.total} {unit} ({args.after})   type: {value_type[0]}")
        of = "of: self, as the innermost frame; total, anywhere on the stack"
        if levels:
            print(f"{'change':>10} {'of':5} {'base':>9} {'after':>9}  function   (each process's latest reading, compared by value; {of})")
        else:
            print(f"{'change':>8} {'of':5} {'base':>7} {'after':>7}  function   (shares of each side's total; {of}; ~: within sampling noise)")
        for title, rows in zip(HEADINGS.get(value_type[0], COSTS), (increases(changes, args.top), decreases(changes, args.top))):
            print(title)
            for change in rows:
                print(_level_row(change, value_type[1]) if levels else _row(change))
        if args.output:
            try:
                _write_page(Path(args.output), stacks_of, value_type, (_side_name("base", args.base, args.base_where),
                                                                       _side_name("after", args.after, args.after_where)))
            except (OSError, RuntimeError) as error:
                print(f"pycollector diff: {args.output}: {error}", file=sys.stderr)
                return 1
            print(f"wrote {args.output}")
        return 0


def _row(change: Change) -> str:
    mark = "~" if change.noise else " "
    base, after = change.shares()
    return f"{100 * change.change:+7.1f}%{mark}{change.by:5} {100 * base:6.1f}% {100 * after:6.1f}%  {change.function}"


def _level_row(change: Change, unit: str) -> str:
    """A function's values on each side and their change, in the type's unit (+5.00MiB)."""
    def signed(value: int) -> str:
        return ("+" if value > 0 else "-" if value < 0 else "") + format_value(abs(value), unit)

    base, after = change.values()
    return f"{signed(after - base):>10} {change.by:5} {format_value(base, unit):>9} {format_value(after, unit):>9}  {change.function}"


def _side_name(side: str, path: str, where: list[tuple[str, str]]) -> str:
    """How the page names a side: ``base: v1.json service.version=1``."""
    return " ".join([f"{side}: {Path(path).name}", *(f"{key}={value}" for key, value in where)])


def _write_page(output: Path, stacks_of: list, value_type: tuple[str, str], names: tuple[str, str]) -> None:
    """The flame graph page with the two sides as two processes told apart by a `profile`
    attribute, opened on their comparison."""
    import collections

    from exporters.flamegraph.page import PageTemplate, RendererMissing
    from exporters.flamegraph.tree import page_data
    from exporters.flamegraph.window import NO_SPAN, ProcessKey

    totals: dict = {value_type: {}}
    resources = {}
    for name, stacks in zip(names, stacks_of):
        key = ProcessKey(None, name, "")
        counter: collections.Counter = collections.Counter()
        for stack, value in stacks:
            counter[stack] += value
        totals[value_type][key] = {NO_SPAN: counter}
        resources[key] = {"profile": name}
    data = page_data(totals, 0, socket.gethostname(), resources=resources)
    data["compare"] = {"mode": "resource", "key": "profile", "base": names[0], "after": names[1]}
    try:
        template = PageTemplate()
    except RendererMissing as error:
        raise RuntimeError(str(error)) from error
    output.write_bytes(template.render(data, live=False))


command = DiffCommand()
