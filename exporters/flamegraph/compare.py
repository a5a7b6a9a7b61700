"""Two profiles compared function by function: what now costs more, and what less (issue 27).

Each side is a set of stacks (root first, (function, frame type) per frame) with values. A
function's *self* share is the part of its side's total spent with it as the innermost frame of
the program's language (a Python process's samples end in the interpreter's C code, and its
developer reads ``spin_heavy (app.py)``, not ``_PyEval_EvalFrameDefault``), else as the leaf; its
*total* share, the part with it anywhere on the stack (counted once per stack, however deep it
recurses). Shares are normalized by each side's total, so two windows of different lengths
compare fairly. The page's compare.js counts the same way.

A change is flagged as noise when it is smaller than twice the standard error of a difference of
two proportions drawn from samples of the two sides' sizes (only where the values count samples:
off-CPU nanoseconds have no sample count to judge by).

A function is ranked by its self change, or by its total change where that tells what its self
change does not (each row says which). The most common regression is a caller that now calls an
expensive helper more often: the helper's self share does not move (all its callers' time is in
it on both sides), the caller's total does, as ``go tool pprof -diff_base`` shows in its cum
column. But every caller's total also moves with a callee that itself got slower (a leak's
callers all hold more): that part is the callee's to list, not theirs. So a function's total
change is split by the self owners under it; of each owner's part, what the owner's own change
explains (its change, in the share of its self time this function's stacks held) is taken out,
and the rest, ``caller_change``, is this function's doing. A function is ranked by total when
that rest is beyond the noise, half a point at least and more than its self change.

Levels (the live heap's in-use bytes and objects: readings at a time, not counts over it) are
compared by value: both sides' shares are taken of the larger side's total, so a function's change
is its change in value (a leak grows the level; shares of each side's own total would hide growth
every function shares). A side of a level is each process's latest reading in its file.

Memory stacks end at their allocation site: an OTLP file's allocator frames are left out by
allocation_sites.py's rule, a pprof file's by its own ``drop_frames`` (as pprof reads it), so the
self share of an allocation is its site's.

Readers: pprof files (ours, or any `go tool pprof` can read: gzipped or not) and OTLP profile
files (the `file` exporter's JSON lines or protobuf).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import math
import re
from collections.abc import Iterable
from pathlib import Path

from pycollector.pdata import GOROUTINES, display_order, is_memory, is_snapshot

from exporters.allocation_sites import allocator_depth, pprof_pattern

# A frame: its function's name (a language frame's with its file: ``spin_heavy (app.py)``) and
# its frame type (``native``, ``kernel``, ``cpython``...; "" where the file does not say).
Frame = tuple[str, str]
# A stack, root first; a side: stack -> value.
Stack = tuple[Frame, ...]
# Frame types of code an interpreter or a JIT runs (as the profiling receiver marks them).
LANGUAGE_TYPES = frozenset({"cpython", "jvm", "v8js"})
_LINE_SUFFIX = re.compile(r":\d+\)$")


@dataclasses.dataclass
class Side:
    total: int
    samples: int | None  # how many samples the values count (None: values are not counts)
    self_values: collections.Counter
    total_values: collections.Counter
    under: dict[str, collections.Counter]  # function -> self owner -> value of its stacks with that owner

    @classmethod
    def of(cls, stacks: Iterable[tuple[Stack, int]], counts_samples: bool = True) -> "Side":
        self_values: collections.Counter = collections.Counter()
        total_values: collections.Counter = collections.Counter()
        under: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        total = 0
        for stack, value in stacks:
            if not stack or value <= 0:
                continue
            total += value
            owner = self_owner(stack)
            self_values[owner] += value
            for function in {name for name, _ in stack}:
                total_values[function] += value
                under[function][owner] += value
        return cls(total, total if counts_samples else None, self_values, total_values, under)


def kept_apart(*sides: list[tuple[Stack, int]]) -> list[list[tuple[Stack, int]]]:
    """The sides' stacks with each function that has a namesake of another frame type (the
    kernel's memcpy and libc's, a Go and a C function of one name) named with its type, as
    ``memcpy [kernel]``, so the two are two rows; a name that means one function is left as it is."""
    kinds: dict[str, set[str]] = collections.defaultdict(set)
    for stacks in sides:
        for stack, _ in stacks:
            for name, kind in stack:
                kinds[name].add(kind or "native")
    shared = {name for name, found in kinds.items() if len(found) > 1}
    if not shared:
        return [list(stacks) for stacks in sides]

    def named(stack: Stack) -> Stack:
        return tuple((f"{name} [{kind or 'native'}]" if name in shared else name, kind) for name, kind in stack)

    return [[(named(stack), value) for stack, value in stacks] for stacks in sides]


def self_owner(stack: Stack) -> str:
    """Whose self time a stack is: its innermost frame of the program's language, else its leaf."""
    for name, kind in reversed(stack):
        if kind in LANGUAGE_TYPES:
            return name
    return stack[-1][0]


@dataclasses.dataclass(frozen=True)
class Change:
    function: str
    base_self: float  # shares (of each side's total; for levels, of the larger side's)
    after_self: float
    base_total: float
    after_total: float
    self_noise: bool  # the self change is within the sampling noise of the two sides' counts
    base_self_value: int = 0  # the values, in the sample type's unit
    after_self_value: int = 0
    base_total_value: int = 0
    after_total_value: int = 0
    total_noise: bool = False  # likewise, the total change
    caller_change: float = 0.0  # the part of the total change no callee's own change explains (the module's doc)

    @property
    def self_change(self) -> float:
        return self.after_self - self.base_self

    @property
    def total_change(self) -> float:
        return self.after_total - self.base_total

    @property
    def by(self) -> str:
        """What the function is ranked by: "total" when its own part of its total change is beyond
        the noise, half a point at least and more than its self change; else "self"."""
        own = abs(self.caller_change)
        rival = 0.0 if self.self_noise else abs(self.self_change)
        return "total" if not self.total_noise and own >= MIN_CALLER_CHANGE and own > rival else "self"

    @property
    def change(self) -> float:
        return self.total_change if self.by == "total" else self.self_change

    @property
    def noise(self) -> bool:
        return self.total_noise if self.by == "total" else self.self_noise

    def shares(self) -> tuple[float, float]:
        """(base, after) shares of what the change is of."""
        return (self.base_total, self.after_total) if self.by == "total" else (self.base_self, self.after_self)

    def values(self) -> tuple[int, int]:
        return (self.base_total_value, self.after_total_value) if self.by == "total" else (self.base_self_value, self.after_self_value)


MIN_CALLER_CHANGE = 0.005  # (of a share: half a point)


def compare(base: Side, after: Side, levels: bool = False) -> list[Change]:
    """Every function of either side, the largest increase first (by self or total: Change.by), the
    largest decrease last; ``levels``: the values are levels, compared by value (see the module's doc)."""
    over = max(base.total, after.total)
    base_over, after_over = (over, over) if levels else (base.total, after.total)

    def change_of(base_value: int, after_value: int) -> float:
        return _share(after_value, after_over) - _share(base_value, base_over)

    def caller_change(function: str) -> float:
        rest = 0.0
        for owner in set(base.under.get(function, ())) | set(after.under.get(function, ())):
            base_under, after_under = base.under[function][owner], after.under[function][owner]
            base_own, after_own = base.self_values[owner], after.self_values[owner]
            held = _share(base_under, base_own) if base_own else _share(after_under, after_own)
            rest += change_of(base_under, after_under) - held * change_of(base_own, after_own)
        return rest

    changes = []
    for function in set(base.total_values) | set(after.total_values):
        values = (base.self_values[function], after.self_values[function], base.total_values[function], after.total_values[function])
        base_self, after_self = _share(values[0], base_over), _share(values[1], after_over)
        base_total, after_total = _share(values[2], base_over), _share(values[3], after_over)
        self_noise = not levels and _within_noise(base_self, after_self, base.samples, after.samples)
        total_noise = not levels and _within_noise(base_total, after_total, base.samples, after.samples)
        changes.append(Change(function, base_self, after_self, base_total, after_total, self_noise, *values, total_noise=total_noise,
                              caller_change=caller_change(function)))
    # (of equal changes, a function's own before its callers', whose totals carry it)
    changes.sort(key=lambda change: (-change.change, (change.by == "total") == (change.change > 0), change.function))
    return changes


def _share(value: int, over: int) -> float:
    return value / over if over else 0.0


def increases(changes: list[Change], top: int) -> list[Change]:
    return [change for change in changes if change.change > 0][:top]


def decreases(changes: list[Change], top: int) -> list[Change]:
    return [change for change in reversed(changes) if change.change < 0][:top]


def _within_noise(p1: float, p2: float, n1: int | None, n2: int | None) -> bool:
    if not n1 or not n2:
        return False
    error = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return abs(p2 - p1) <= 2 * error


# -- readers ------------------------------------------------------------------------------------


def go_scheduler_depth(leaf_first: list[str]) -> int:
    """How many of a goroutine stack's innermost frames are Go's scheduler's (runtime.gopark,
    runtime.chanrecv...: where every parked goroutine's stack ends), so that a goroutine counts
    where the program made it wait, as an allocation counts at its site; at least one frame stays."""
    depth = 0
    while depth < len(leaf_first) - 1 and leaf_first[depth].startswith("runtime."):
        depth += 1
    return depth


def read_stacks(path: str | Path, sample_type: str | None = None, process: str | None = None,
                where: dict[str, str] | None = None) -> tuple[list[tuple[Stack, int]], tuple[str, str], bool]:
    """(stacks, the sample type read as (type, unit), whether its values count samples) of a pprof
    or OTLP file (gzip or zstd compressed or not). For an OTLP file, ``process`` keeps the samples
    of one process (its pid, executable name or service.name), ``where`` those whose resource has
    these attribute values (``{"service.version": "1.4"}``)."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:4] == b"\x28\xb5\x2f\xfd":  # (the file exporter's compression: zstd)
        import zstandard

        data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    if data.lstrip()[:1] == b"{":
        return _otlp_stacks(_otlp_messages(data, "json"), sample_type, process, where or {})
    pprof_error = None
    try:
        stacks, value_type, counts = _pprof_stacks(data, sample_type)
    except ValueError as error:
        pprof_error = error
    else:
        if process is not None or where:
            raise ValueError("a pprof file has no processes or resource attributes to filter by (--process and --where are for OTLP files)")
        return stacks, value_type, counts
    try:
        try:
            messages = _otlp_messages(data, "proto")
        except ValueError:  # (not framed: one message, as an OTLP/HTTP body is)
            messages = [_decode_otlp(data, "proto")]
    except Exception:
        # Not OTLP either: a pprof file without the type asked for says so, not that it is no OTLP.
        if isinstance(pprof_error, _NoSuchType):
            raise pprof_error from None
        raise
    return _otlp_stacks(messages, sample_type, process, where or {})


def _otlp_messages(data: bytes, encoding: str) -> list:
    """The ProfilesData of a file the file exporter wrote, in whatever layout it wrote them."""
    from exporters.file.encoding import unframe

    return [_decode_otlp(body, encoding) for body in unframe(data, encoding)]


def _decode_otlp(body: bytes, encoding: str):
    from opentelemetry.proto.profiles.v1development import profiles_pb2

    from pycollector.otlp.profiles_wire.codec import decode
    from pycollector.pdata.serialized import as_message

    return as_message(decode(body, encoding, profiles_pb2.ProfilesData).message)


class _NoSuchType(ValueError):
    pass


def _pprof_stacks(data: bytes, wanted: str | None) -> tuple[list[tuple[Stack, int]], tuple[str, str], bool]:
    from google.protobuf.message import DecodeError

    from exporters.pprof.profile_proto import Profile

    profile = Profile()
    try:
        profile.ParseFromString(data)
    except DecodeError as error:
        raise ValueError(f"not a pprof profile: {error}") from error
    if not profile.sample_type or not profile.string_table:
        raise ValueError("not a pprof profile: no sample type")
    strings = profile.string_table
    types = [strings[value_type.type] for value_type in profile.sample_type]
    if wanted is not None:
        if wanted not in types:
            raise _NoSuchType(f"no sample type {wanted!r} (it has {', '.join(types)})")
        index = types.index(wanted)
    elif profile.default_sample_type:
        index = types.index(strings[profile.default_sample_type])
    else:
        index = len(types) - 1  # (what go tool pprof shows by default)
    # What pprof drops on reading (a heap profile's allocator frames), dropped here too.
    dropped = pprof_pattern(strings[profile.drop_frames], strings[profile.keep_frames]) if profile.drop_frames else None
    functions = {function.id: _pprof_frame(strings[function.name], strings[function.filename]) for function in profile.function}
    locations = {}
    for location in profile.location:
        # Inlined frames: the first line is the innermost; the stack reads them outermost first.
        frames = [functions.get(line.function_id, ("", "")) for line in reversed(location.line)]
        address = f"0x{location.address:x}"
        locations[location.id] = tuple((name or address, kind) for name, kind in frames) or ((address, ""),)
    stacks = []
    for sample in profile.sample:
        frames: list[Frame] = []
        for location_id in reversed(sample.location_id):  # (leaf first in the file)
            frames.extend(locations.get(location_id, (("?", ""),)))
        if dropped is not None:
            frames = frames[:len(frames) - allocator_depth([name for name, _ in reversed(frames)], dropped)]
        stacks.append((tuple(frames), sample.value[index]))
    unit = strings[profile.sample_type[index].unit]
    return stacks, (types[index], unit), unit == "count"


# A pprof file names no frame types: a function's file tells its language, where it has one.
_LANGUAGE_OF_FILE = {".py": "cpython", ".java": "jvm", ".kt": "jvm", ".scala": "jvm", ".js": "v8js", ".mjs": "v8js", ".cjs": "v8js", ".ts": "v8js"}


def _pprof_frame(name: str, filename: str) -> Frame:
    """A pprof function as a frame: a language's (by its file's suffix) named as the OTLP files'
    are, ``spin_heavy (app.py)``, so that its self time is its own and not the interpreter's."""
    kind = _LANGUAGE_OF_FILE.get(Path(filename).suffix, "") if filename else ""
    return (f"{name} ({Path(filename).name})" if kind and name else name, kind)


def _selected(resource: dict, process: str | None, where: dict[str, str]) -> bool:
    if process is not None and process not in (str(resource.get("process.pid")), resource.get("process.executable.name"), resource.get("service.name")):
        return False
    return all(str(resource.get(key)) == value for key, value in where.items())


def function_name(name: str, frame_type: str) -> str:
    """How a function is listed: a language frame without its line, so a function is one row
    whichever line its samples were on (``spin_heavy (app.py:16)`` -> ``spin_heavy (app.py)``)."""
    return _LINE_SUFFIX.sub(")", name) if frame_type in LANGUAGE_TYPES else name


def _otlp_stacks(messages: list, wanted: str | None, process: str | None, where: dict[str, str]) -> tuple[list[tuple[Stack, int]], tuple[str, str], bool]:
    from pycollector.pdata import iter_samples, sample_type

    from exporters.flamegraph.window import process_key
    from exporters.profiles import FrameNames, sample_value

    by_type: dict[tuple[str, str], list] = collections.defaultdict(list)
    readings: dict[tuple, tuple[int, list]] = {}  # (level type, process) -> (the time of its latest reading, its stacks)
    for message in messages:
        current, value_type, into = None, None, None
        names = FrameNames(message.dictionary)  # (the flame graph's names: a frame with no symbol by its file and address)
        for view in iter_samples(message):
            if not _selected(view.resource, process, where):
                continue
            if view.profile is not current:
                current, value_type = view.profile, sample_type(message, view.profile)
                into = by_type[value_type]
                if is_snapshot(value_type):  # a level: each process's latest reading only
                    at, key = current.time_unix_nano + current.duration_nano, (value_type, process_key(view.resource))
                    if key not in readings or at > readings[key][0]:
                        readings[key] = (at, [])
                    into = readings[key][1] if readings[key][0] == at else None
            if into is None:  # (an older reading)
                continue
            leaf_first = names.of_stack(view.sample.stack_index)
            kept = len(leaf_first) - (allocator_depth(leaf_first) if is_memory(value_type) else go_scheduler_depth(leaf_first)
                                      if value_type == GOROUTINES else 0)
            frames = list(zip(reversed(leaf_first), reversed(view.frames)))[:kept]
            into.append((tuple((function_name(name, frame.frame_type), frame.frame_type) for name, frame in frames), sample_value(view)))
    for (value_type, _), (_, stacks) in readings.items():
        by_type[value_type].extend(stacks)
    if not by_type:
        chosen_by = [f"of process {process!r}"] if process else []
        chosen_by += [f"with {key}={value}" for key, value in (where or {}).items()]
        raise ValueError(" ".join(["no samples", *chosen_by]))
    if wanted is None:  # CPU samples, else what a person looks at first (in-use bytes before allocated)
        chosen = min(by_type, key=display_order)
    else:
        chosen = next((value_type for value_type in by_type if value_type[0] == wanted), None)
        if chosen is None:
            raise ValueError(f"no sample type {wanted!r} (it has {', '.join(name for name, _ in by_type)})")
    return by_type[chosen], chosen, chosen[1] == "count"
