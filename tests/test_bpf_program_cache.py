"""The compiled BPF program: its on-disk form read as untrusted input, the cache's trust checks, and a
profiler that starts from the cache without compiling and without loading LLVM."""

from __future__ import annotations

import ctypes as ct
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import structlog

from receivers.profiling.kernel import compiled as compiled_program, ctypes_layout
from receivers.profiling.kernel.compiled import CompiledProgram, FunctionSpec, MapSpec, ProgramFormatError
from receivers.profiling.kernel.program_cache import MAX_FILES, ProgramCache
from receivers.profiling.kernel.sampler import Sampler
from receivers.profiling.kernel.settings import SamplerSettings
from tests.test_profiling_sampler import HZ, require_bpf

REPO = Path(__file__).resolve().parent.parent
EXIT = bytes([0x95, 0, 0, 0, 0, 0, 0, 0])


def ld_map(register: int = 1, source: int = compiled_program.PSEUDO_MAP_FD, immediate: int = 0) -> bytes:
    return bytes([compiled_program.LD_IMM64, source << 4 | register, 0, 0]) + immediate.to_bytes(4, "little") + bytes(8)


def a_program(references=((0, 0),), instructions=None) -> CompiledProgram:
    spec = MapSpec("counts", 1, 4, 8, 16, 0, "c_uint", "c_ulonglong", None)
    function = FunctionSpec("on_sample", instructions if instructions is not None else ld_map() + EXIT, tuple(references))
    return CompiledProgram("GPL", 0, (spec,), (function,))


def tampered(program: CompiledProgram, change) -> bytes:
    document = json.loads(program.to_json())
    change(document)
    return json.dumps(document).encode()


# -- layouts and the program's form ----------------------------------------------------------


def test_a_layout_rebuilds_the_same_type():
    class Inner(ct.Union):
        _fields_ = [("word", ct.c_uint64), ("bytes", ct.c_ubyte * 8)]

    class Event(ct.Structure):
        _pack_ = 1
        _fields_ = [("pid", ct.c_uint32), ("flags", ct.c_uint32, 3), ("comm", ct.c_char * 16),
                    ("ips", ct.c_ulonglong * 127), ("inner", Inner)]

    rebuilt = ctypes_layout.build(json.loads(json.dumps(ctypes_layout.describe(Event))))
    assert ct.sizeof(rebuilt) == ct.sizeof(Event)
    assert [(name, getattr(rebuilt, name).offset) for name, *_ in Event._fields_] == \
        [(name, getattr(Event, name).offset) for name, *_ in Event._fields_]
    value = rebuilt(pid=7, comm=b"spin")
    value.ips[126] = 0xFFFF
    copy = Event.from_buffer_copy(bytes(value))
    assert (copy.pid, copy.comm, copy.ips[126]) == (7, b"spin", 0xFFFF)


@pytest.mark.parametrize("layout", ["c_nothing", {"array": "c_int", "length": 1 << 30}, {"array": "c_int"},
                                    {"struct": [["a", "c_int", 99]], "pack": 0, "anonymous": []},
                                    {"struct": [["a", "c_int"]], "pack": 3, "anonymous": []},
                                    {"struct": [["a", "c_int"]], "pack": 0, "anonymous": ["b"]}, 5, None])
def test_a_layout_that_is_not_one_is_refused(layout):
    with pytest.raises(ctypes_layout.LayoutError):
        ctypes_layout.build(layout)


def test_a_program_survives_its_file_form():
    program = a_program()
    assert CompiledProgram.from_json(program.to_json()) == program


@pytest.mark.parametrize("change, reason", [
    (lambda d: d["functions"][0].update(map_references=[[0, 1]]), "map index"),  # a map that is not there
    (lambda d: d["functions"][0].update(map_references=[[1, 0]]), "do not match"),  # not at a map load
    (lambda d: d["functions"][0].update(map_references=[]), "do not match"),  # a map load left with fd 0
    (lambda d: d["functions"][0].update(instructions="AAAA"), "bytes of instructions"),
    (lambda d: d["functions"][0].update(instructions="not base64!"), "base64"),
    (lambda d: d["maps"][0].update(key_size=-4), "key_size"),
    (lambda d: d["maps"][0].update(name="../etc"), "C identifier"),
    (lambda d: d["maps"][0].update(value={"array": "c_int", "length": -1}), "array length"),
    (lambda d: d.update(format=0), "format"),
    (lambda d: d.update(extra=1), "expected the keys"),
    (lambda d: d["maps"].append(d["maps"][0]), "given twice"),
])
def test_a_damaged_program_is_refused_with_its_reason(change, reason):
    with pytest.raises(ProgramFormatError, match=reason):
        CompiledProgram.from_json(tampered(a_program(), change))


def test_a_64_bit_load_the_loader_cannot_place_is_refused():
    """Kind 2 (a map value's address) and the rest are relocations the loader does not make: such a
    program is refused, not loaded with the compiling process's numbers in it."""
    program = a_program(references=(), instructions=ld_map(source=2) + EXIT)
    with pytest.raises(ProgramFormatError, match="of kind 2"):
        CompiledProgram.from_json(program.to_json())


# -- the cache --------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path):
    directory = tmp_path / "bpf"
    directory.mkdir(mode=0o700)
    return ProgramCache(str(directory), structlog.get_logger("test"))


def test_what_the_cache_keeps_it_gives_back(cache):
    cache.put("k", a_program())
    assert cache.get("k") == a_program()
    assert cache.get("other") is None
    assert cache.stats["hits"] == 1 and cache.stats["misses"] == 1
    assert os.stat(cache.directory + "/k.bpf.json").st_mode & 0o077 == 0


def test_the_cache_keeps_the_most_recently_used(cache):
    for index in range(MAX_FILES + 3):
        cache.put(f"k{index}", a_program())
        os.utime(f"{cache.directory}/k{index}.bpf.json", (index, index))
    cache.prune()
    kept = sorted(os.listdir(cache.directory))
    assert len(kept) == MAX_FILES and "k0.bpf.json" not in kept and f"k{MAX_FILES + 2}.bpf.json" in kept


def _refused(cache, key="k"):
    with structlog.testing.capture_logs() as logs:
        assert cache.get(key) is None
    assert cache.stats["rejected"] == 1, cache.stats
    return " ".join(str(entry) for entry in logs)


def test_a_directory_others_can_write_is_not_trusted(cache):
    cache.put("k", a_program())
    os.chmod(cache.directory, 0o777)
    assert "only this user may write it" in _refused(cache)


def test_a_file_of_another_user_is_not_trusted(cache):
    cache.put("k", a_program())
    os.chown(cache.directory + "/k.bpf.json", 65534, 65534)
    assert "owned by uid 65534" in _refused(cache)


def test_a_link_in_place_of_a_file_is_not_followed(cache, tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_bytes(a_program().to_json())
    os.symlink(real, cache.directory + "/k.bpf.json")
    _refused(cache)


def test_a_fifo_in_place_of_a_file_does_not_hang_the_agent(cache):
    os.mkfifo(cache.directory + "/k.bpf.json", 0o600)
    started = time.monotonic()
    assert "not a regular file" in _refused(cache)
    assert time.monotonic() - started < 5


def test_a_damaged_file_is_compiled_again_not_loaded(cache):
    cache.put("k", a_program())
    Path(cache.directory, "k.bpf.json").write_bytes(tampered(a_program(), lambda d: d["functions"][0].update(map_references=[])))
    assert "damaged" in _refused(cache)


def test_a_cache_directory_that_cannot_be_trusted_is_not_written(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # (no sticky bit: anyone could rename the cache out of it)
    cache = ProgramCache(str(shared / "bpf"), structlog.get_logger("test"))
    with structlog.testing.capture_logs() as logs:
        cache.put("k", a_program())
    assert cache.stats["write_errors"] == 1 and "can be changed by others" in str(logs)
    assert not (shared / "bpf" / "k.bpf.json").exists()


# -- a profiler started from the cache ----------------------------------------------------------

_START = textwrap.dedent("""
    import json, resource, subprocess, sys, time
    from receivers.profiling.kernel.sampler import Sampler
    from receivers.profiling.kernel.settings import SamplerSettings
    sampler = Sampler(SamplerSettings({hz}, 4096, 4096, program_cache_dir=sys.argv[1]))
    sampler.start()
    maps = open("/proc/self/maps").read()
    busy = subprocess.run([sys.executable, "-c", "import time\\nend = time.time() + 1\\nwhile time.time() < end: pass"])
    time.sleep(0.1)
    samples = sum(sampler.collect().sample_count for _ in range(1))
    sampler.close()
    print(json.dumps({{"stats": sampler.program_cache.stats, "samples": samples, "llvm": "libLLVM" in maps,
                      "libbcc": "libbcc.so" in maps}}))
""").format(hz=HZ)


def _start_profiler(directory: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _START, str(directory)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_restart_loads_the_program_without_compiling_it_and_without_llvm(tmp_path):
    """The first start compiles in a child (whose LLVM goes when it exits) and keeps the program;
    the second loads it. Both sample; neither maps LLVM or libbcc into the agent."""
    require_bpf()
    directory = tmp_path / "bpf"
    first = _start_profiler(directory)
    assert first["stats"]["misses"] == 1 and first["stats"]["hits"] == 0
    assert len(list(directory.glob("*.bpf.json"))) == 1
    second = _start_profiler(directory)
    assert second["stats"]["hits"] == 1 and second["stats"]["misses"] == 0
    for start in (first, second):
        assert start["samples"] >= HZ // 2, start  # (a one-second busy child: about HZ samples)
        assert not start["llvm"] and not start["libbcc"], start


def test_a_cache_that_does_not_match_the_program_is_not_used(tmp_path):
    """Anything that changes the compiled program changes its name: other map sizes miss."""
    require_bpf()
    directory = tmp_path / "bpf"
    for size in (1024, 2048):
        sampler = Sampler(SamplerSettings(HZ, size, 1024, program_cache_dir=str(directory)))
        sampler.start()
        sampler.close()
        assert sampler.program_cache.stats["misses"] == 1
    assert len(list(directory.glob("*.bpf.json"))) == 2


# -- the loader and the maps, on the real kernel ----------------------------------------------

MOV_R0_0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0])


def _tiny(maps: tuple[MapSpec, ...], instructions: bytes | None = None) -> CompiledProgram:
    """A program whose one function loads each map's address and returns 0."""
    body = b"".join(ld_map() for _ in maps) + MOV_R0_0 + EXIT
    references = tuple((2 * index, index) for index in range(len(maps)))
    return CompiledProgram("GPL", 0, maps, (FunctionSpec("tiny", instructions or body, references if instructions is None else ()),))


def test_the_verifier_s_refusal_is_a_load_error_with_its_log():
    require_bpf()
    from receivers.profiling.kernel.loader import LoadedProgram
    from receivers.profiling.kernel.program import BPFLoadError

    with pytest.raises(BPFLoadError) as refused:
        LoadedProgram.load(_tiny((), instructions=EXIT), {b"tiny": "PERF_EVENT"})  # r0 never set
    assert "tiny" in str(refused.value) and "R0" in refused.value.log


def test_maps_behave_as_bcc_tables_do():
    require_bpf()
    from receivers.profiling.kernel.loader import LoadedProgram

    point = {"struct": [["pid", "c_uint"], ["count", "c_ulonglong"]], "pack": 0, "anonymous": []}
    loaded = LoadedProgram.load(_tiny((MapSpec("by_pid", 1, 4, 16, 64, 0, "c_uint", point),
                                       MapSpec("slots", 2, 4, 4, 8, 0, "c_uint", "c_uint"),
                                       MapSpec("totals", 6, 4, 8, 2, 0, "c_uint", "c_ulonglong"))), {b"tiny": "PERF_EVENT"})
    try:
        by_pid, slots, totals = loaded[b"by_pid"], loaded["slots"], loaded[b"totals"]
        assert loaded.function_fd(b"tiny") > 0
        with pytest.raises(KeyError):
            by_pid[by_pid.Key(1)]
        assert by_pid.get(by_pid.Key(1)) is None
        by_pid[by_pid.Key(1)] = by_pid.Leaf(1, 10)
        keys = (by_pid.Key * 3)(2, 3, 4)
        by_pid.items_update_batch(keys, (by_pid.Leaf * 3)(by_pid.Leaf(2, 20), by_pid.Leaf(3, 30), by_pid.Leaf(4, 40)))
        assert sorted((key.value, value.count) for key, value in by_pid.items()) == [(1, 10), (2, 20), (3, 30), (4, 40)]
        assert sorted(key for key, _ in by_pid.items_lookup_batch()) == [1, 2, 3, 4] and len(by_pid) == 4
        del by_pid[by_pid.Key(2)]
        with pytest.raises(KeyError):
            del by_pid[by_pid.Key(2)]
        assert sorted(value.count for _, value in by_pid.items_lookup_and_delete_batch()) == [10, 30, 40]
        assert len(by_pid) == 0
        slots[3] = slots.Leaf(7)
        assert slots[slots.Key(3)].value == 7 and len(slots) == 8 and len(list(slots.keys())) == 8
        del slots[3]  # an array's entry is zeroed
        assert slots[3].value == 0
        with pytest.raises(IndexError):
            slots[8]
        assert totals.sum(totals.Key(0)).value == 0
        totals[totals.Key(1)] = totals.Leaf(*[5] * len(totals.Leaf()))
        assert totals.sum(totals.Key(1)).value == 5 * len(totals.Leaf())
    finally:
        loaded.cleanup()


def test_layouts_that_do_not_fill_the_map_s_sizes_are_refused():
    """The kernel writes value_size bytes into a buffer of the value layout's size: a file that
    says a 4096-byte value is one char would have it write past the buffer."""
    with pytest.raises(ProgramFormatError, match="layouts of 4 and 1 bytes"):
        CompiledProgram.from_json(tampered(a_program(), lambda d: d["maps"][0].update(value="c_char", value_size=4096)))


@pytest.mark.parametrize("data", [b"[" * 100_000 + b"]" * 100_000,
                                  json.dumps({"array": {"array": "c_ulonglong", "length": 1 << 24}, "length": 1 << 24}).encode()])
def test_whatever_a_damaged_file_holds_is_a_format_error(data, cache):
    if data.startswith(b"{"):  # (a layout ctypes would overflow on, inside an otherwise good program)
        data = tampered(a_program(), lambda d: d["maps"][0].update(value=json.loads(data)))
    with pytest.raises(ProgramFormatError):
        CompiledProgram.from_json(data)
    Path(cache.directory, "k.bpf.json").write_bytes(data)
    _refused(cache)


def test_a_kept_program_the_kernel_refuses_is_replaced(tmp_path):
    """A program in the cache under the right name that the verifier rejects (a kernel that
    changed under the same release, say) is removed and compiled again; the profiler starts."""
    require_bpf()
    from receivers.profiling.kernel.program import find_kernel_headers, program_text
    from receivers.profiling.kernel.program_cache import cache_key

    directory = tmp_path / "bpf"
    sampler = Sampler(SamplerSettings(HZ, 1024, 1024, program_cache_dir=str(directory)))
    key = cache_key(program_text(sampler.source), sampler.source.parent, sampler.cflags(), find_kernel_headers())
    refused = CompiledProgram("GPL", 0, (), (FunctionSpec("on_cpu_sample", EXIT, ()),))  # r0 never set
    sampler.program_cache.put(key, refused)
    with structlog.testing.capture_logs() as logs:
        sampler.start()
    try:
        assert sampler.program_cache.stats["rejected"] == 1 and "the kernel refused it" in str(logs)
        assert CompiledProgram.from_json((directory / f"{key}.bpf.json").read_bytes()) != refused
    finally:
        sampler.close()


def test_the_compiler_child_imports_nothing_from_the_current_directory(tmp_path):
    """It runs as root: a json.py where the agent was started must not run (the agent itself is
    started as its console script is, without the current directory on its path: -P)."""
    require_bpf()
    marker = tmp_path / "imported"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom importlib import import_module\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from receivers.profiling.kernel.sampler import Sampler; "
            "from receivers.profiling.kernel.settings import SamplerSettings; s = Sampler(SamplerSettings(97, 1024, 1024)); "
            "s.start(); s.close(); print('started')")
    done = subprocess.run([sys.executable, "-P", "-c", code, str(REPO)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert "started" in done.stdout, done.stderr[-2000:]
    assert not marker.exists()
