"""CPython's struct offsets, checked against each installed interpreter's own headers.

For every pyenv build a C probe, compiled against that version's headers (the internal ones with
Py_BUILD_CORE where the structs are internal), prints offsetof()/sizeof() of every field the
table holds; each must equal the table's number, and a field the table leaves out (None) must be
one the probe has no expression for in that version. 3.13 has no table: its offsets are read from
a running interpreter's _PyRuntime (the _Py_DebugOffsets at its start, through /proc/PID/mem) and
compared with the same probe. Detection: each interpreter's executable and library, and
Debian's /usr/bin/python3.11, are recognized with their version and the symbols the walker needs.
A missing interpreter skips its case.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from receivers.profiling.python import offsets as offsets_module
from receivers.profiling.python.detect import detect_cpython
from receivers.profiling.processes.memory import ProcessMemory
from receivers.profiling.python.offsets import OFFSETS, read_debug_offsets

PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
VERSIONS = [(2, 7), (3, 6), (3, 7), (3, 8), (3, 9), (3, 10), (3, 11), (3, 12), (3, 13)]
LAST = (9, 99)

# The probe's expression for each field, by the first and last version it holds for. A field with
# no expression for a version must be None in that version's offsets.
PROBE: dict[str, list[tuple[tuple[int, int], tuple[int, int], str]]] = {
    "runtime_interpreters_head": [((3, 7), LAST, "offsetof(_PyRuntimeState, interpreters.head)")],
    "interpreter_next": [((2, 7), LAST, "offsetof(PyInterpreterState, next)")],
    "interpreter_threads_head": [((2, 7), (3, 10), "offsetof(PyInterpreterState, tstate_head)"),
                                 ((3, 11), LAST, "offsetof(PyInterpreterState, threads.head)")],
    "thread_next": [((2, 7), LAST, "offsetof(PyThreadState, next)")],
    "thread_interpreter": [((2, 7), LAST, "offsetof(PyThreadState, interp)")],
    "thread_id": [((2, 7), LAST, "offsetof(PyThreadState, thread_id)")],
    "thread_native_id": [((3, 11), LAST, "offsetof(PyThreadState, native_thread_id)")],
    "thread_frame": [((2, 7), (3, 10), "offsetof(PyThreadState, frame)"),
                     ((3, 11), (3, 12), "offsetof(PyThreadState, cframe)"),
                     ((3, 13), LAST, "offsetof(PyThreadState, current_frame)")],
    "cframe_current_frame": [((3, 11), (3, 12), "offsetof(_PyCFrame, current_frame)")],
    "frame_code": [((2, 7), (3, 10), "offsetof(PyFrameObject, f_code)"),
                   ((3, 11), (3, 12), "offsetof(_PyInterpreterFrame, f_code)"),
                   ((3, 13), LAST, "offsetof(_PyInterpreterFrame, f_executable)")],
    "frame_previous": [((2, 7), (3, 10), "offsetof(PyFrameObject, f_back)"),
                       ((3, 11), LAST, "offsetof(_PyInterpreterFrame, previous)")],
    "frame_instruction": [((2, 7), (3, 10), "offsetof(PyFrameObject, f_lasti)"),
                          ((3, 11), (3, 12), "offsetof(_PyInterpreterFrame, prev_instr)"),
                          ((3, 13), LAST, "offsetof(_PyInterpreterFrame, instr_ptr)")],
    "frame_owner": [((3, 11), (3, 11), "offsetof(_PyInterpreterFrame, is_entry)"),
                    ((3, 12), LAST, "offsetof(_PyInterpreterFrame, owner)")],
    "frame_owner_c_stack": [((3, 12), LAST, "FRAME_OWNED_BY_CSTACK")],
    "object_type": [((2, 7), LAST, "offsetof(PyObject, ob_type)")],
    "code_argcount": [((2, 7), LAST, "offsetof(PyCodeObject, co_argcount)")],
    "code_kwonlyargcount": [((3, 6), (3, 12), "offsetof(PyCodeObject, co_kwonlyargcount)")],
    "code_flags": [((2, 7), (3, 12), "offsetof(PyCodeObject, co_flags)")],
    "code_firstlineno": [((2, 7), LAST, "offsetof(PyCodeObject, co_firstlineno)")],
    "code_name": [((2, 7), LAST, "offsetof(PyCodeObject, co_name)")],
    "code_qualname": [((3, 11), LAST, "offsetof(PyCodeObject, co_qualname)")],
    "code_filename": [((2, 7), LAST, "offsetof(PyCodeObject, co_filename)")],
    "code_linetable": [((2, 7), (3, 9), "offsetof(PyCodeObject, co_lnotab)"),
                       ((3, 10), LAST, "offsetof(PyCodeObject, co_linetable)")],
    "code_instructions": [((3, 11), LAST, "offsetof(PyCodeObject, co_code_adaptive)")],
    "bytes_size": [((2, 7), (2, 7), "offsetof(PyStringObject, ob_size)"),
                   ((3, 6), LAST, "offsetof(PyBytesObject, ob_base.ob_size)")],
    "bytes_data": [((2, 7), (2, 7), "offsetof(PyStringObject, ob_sval)"),
                   ((3, 6), LAST, "offsetof(PyBytesObject, ob_sval)")],
    "unicode_length": [((3, 6), LAST, "offsetof(PyASCIIObject, length)")],
    "unicode_state": [((3, 6), LAST, "offsetof(PyASCIIObject, state)")],
    "unicode_kind_shift": [((3, 6), LAST, "state_bit(1, 0, 0)")],
    "unicode_compact_bit": [((3, 6), LAST, "state_bit(0, 1, 0)")],
    "unicode_ascii_bit": [((3, 6), LAST, "state_bit(0, 0, 1)")],
    "unicode_ascii_data": [((3, 6), LAST, "sizeof(PyASCIIObject)")],
    "unicode_compact_data": [((3, 6), LAST, "sizeof(PyCompactUnicodeObject)")],
    "unicode_legacy_data": [((3, 6), LAST, "offsetof(PyUnicodeObject, data)")],
}

# Which bit of PyASCIIObject.state a bit field starts at: set it in a zeroed object, find the bit.
STATE_BIT = """
static long state_bit(int kind, int compact, int ascii)
{
    PyASCIIObject o;
    unsigned int raw;
    memset(&o, 0, sizeof(o));
    if (kind) o.state.kind = 1;
    if (compact) o.state.compact = 1;
    if (ascii) o.state.ascii = 1;
    memcpy(&raw, (char *)&o + offsetof(PyASCIIObject, state), sizeof(raw));
    return __builtin_ctz(raw);
}
"""


def _includes(version: tuple[int, int]) -> list[str]:
    out = ["Python.h", "frameobject.h"]
    if version == (3, 7):
        out.append("internal/pystate.h")
    elif version == (3, 8):
        out.append("internal/pycore_pystate.h")
    elif version >= (3, 9):
        out += ["internal/pycore_runtime.h", "internal/pycore_interp.h"]
    if version >= (3, 11):
        out.append("internal/pycore_frame.h")
    if version >= (3, 13):
        out.remove("frameobject.h")
    return out


def probe_fields(version: tuple[int, int]) -> dict[str, str]:
    out = {}
    for field, cases in PROBE.items():
        for first, last, expression in cases:
            if first <= version <= last:
                out[field] = expression
    return out


def installed_versions() -> list[tuple[tuple[int, int], Path]]:
    out = []
    for version in VERSIONS:
        found = sorted(PYENV.glob(f"{version[0]}.{version[1]}.*"))
        if found:
            out.append((version, found[-1]))
    return out


def include_dir(prefix: Path) -> Path:
    return next(p for p in sorted((prefix / "include").iterdir()) if p.name.startswith("python"))


def probe(version: tuple[int, int], prefix: Path, workdir: str | Path) -> dict[str, int]:
    """offsetof()/sizeof() of every field, compiled against ``prefix``'s own headers."""
    fields = probe_fields(version)
    source = ["#include <stddef.h>", "#include <stdio.h>", "#include <string.h>"]
    source += [f'#include "{h}"' for h in _includes(version)]
    if version >= (3, 6):
        source.append(STATE_BIT)
    source.append("int main(void) {")
    source += [f'    printf("{name} %ld\\n", (long)({expr}));' for name, expr in fields.items()]
    source.append("    return 0;\n}\n")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    c_file = workdir / f"probe{version[0]}{version[1]}.c"
    c_file.write_text("\n".join(source))
    binary = workdir / f"probe{version[0]}{version[1]}"
    cflags = ["-DPy_BUILD_CORE", "-DPy_BUILD_CORE_MODULE", "-w", "-I", str(include_dir(prefix))]
    result = subprocess.run(["gcc", *cflags, "-o", str(binary), str(c_file)], capture_output=True, text=True)
    assert result.returncode == 0, f"probe for {version} does not compile:\n{result.stderr[-3000:]}"
    output = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {name: int(value) for name, value in (line.split() for line in output.splitlines())}


def _compare(version, offsets, numbers) -> list[str]:
    wrong = []
    for name in PROBE:
        have = getattr(offsets, name)
        want = numbers.get(name)
        if have != want:
            wrong.append(f"{name}: table {have}, {version[0]}.{version[1]}'s headers {want}")
    return wrong


needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is missing")


@needs_gcc
@pytest.mark.parametrize("version", [v for v in VERSIONS if v < (3, 13)], ids=lambda v: f"{v[0]}.{v[1]}")
def test_table_matches_headers(version, tmp_path):
    found = dict(installed_versions())
    if version not in found:
        pytest.skip(f"CPython {version[0]}.{version[1]} is not installed under {PYENV}")
    numbers = probe(version, found[version], tmp_path)
    assert _compare(version, OFFSETS[version], numbers) == []


def _python_executable(prefix: Path, version: tuple[int, int]) -> Path:
    return prefix / "bin" / f"python{version[0]}.{version[1]}"


def load_bias(pid: int, cpython) -> int:
    """Process address - ELF address for ``cpython``'s file in process ``pid``, from its
    executable mapping in /proc/PID/maps."""
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and "x" in parts[1] and os.path.realpath(parts[5]) == os.path.realpath(cpython.path):
                bias = cpython.bias(int(parts[0].split("-")[0], 16), int(parts[2], 16))
                assert bias is not None
                return bias
    raise AssertionError(f"{cpython.path} is not mapped by {pid}")


@needs_gcc
def test_debug_offsets_of_a_running_313(tmp_path):
    version = (3, 13)
    found = dict(installed_versions())
    if version not in found:
        pytest.skip(f"CPython 3.13 is not installed under {PYENV}")
    prefix = found[version]
    numbers = probe(version, prefix, tmp_path)
    library = next((prefix / "lib").glob("libpython3.13.so.1*"))
    cpython = detect_cpython(str(library))
    assert cpython is not None and cpython.version == version
    process = subprocess.Popen([str(_python_executable(prefix, version)), "-c", "import time; print('up', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "up"
        address = cpython.symbols["_PyRuntime"] + load_bias(process.pid, cpython)
        with ProcessMemory(process.pid) as memory:
            offsets = read_debug_offsets(memory.read(address, offsets_module.DEBUG_OFFSETS_MAX_SIZE))
    finally:
        process.kill()
        process.wait()
    assert offsets.version == version
    assert _compare(version, offsets, numbers) == []
    # The same struct as the file holds it (the initializer in .data), for a process not yet read.
    assert cpython.debug_offsets() == offsets


def test_debug_offsets_rejects_what_it_does_not_know():
    with pytest.raises(offsets_module.UnknownLayout):
        read_debug_offsets(b"notdebug" + bytes(600))
    future = b"xdebugpy" + (0x030F00F0).to_bytes(8, "little") + bytes(600)
    with pytest.raises(offsets_module.UnknownLayout, match="3.15"):
        read_debug_offsets(future)


# --------------------------------------------------------------------------------------------
# Detection


def _detection_cases():
    cases = []
    for version, prefix in installed_versions():
        cases.append((version, _python_executable(prefix, version)))
        libs = sorted((prefix / "lib").glob(f"libpython{version[0]}.{version[1]}*.so.1*"))
        if libs:
            cases.append((version, libs[0]))
    if Path("/usr/bin/python3.11").exists():
        cases.append(((3, 11), Path("/usr/bin/python3.11")))
    return cases


def _links_libpython(path: Path) -> bool:
    with open(path, "rb") as f:
        dynamic = ELFFile(f).get_section_by_name(".dynamic")
        return dynamic is not None and any(tag.entry.d_tag == "DT_NEEDED" and "libpython" in tag.needed
                                           for tag in dynamic.iter_tags())


@pytest.mark.parametrize("version,path", _detection_cases(), ids=lambda v: str(v))
def test_detects_each_interpreter(version, path):
    cpython = detect_cpython(str(path))
    if path.name.startswith("python") and _links_libpython(path):
        # pyenv's shared builds: the executable is a stub, the interpreter is its libpython.
        assert cpython is None
        return
    assert cpython is not None, f"{path} not recognized"
    assert cpython.version == version
    assert cpython.path == str(path)
    if version >= (3, 7):
        assert cpython.symbols["_PyRuntime"] > 0
        head = cpython.interpreters_head(cpython.offsets())
        assert head == cpython.symbols["_PyRuntime"] + cpython.offsets().runtime_interpreters_head
    else:
        assert cpython.symbols["interp_head"] > 0
        assert cpython.interpreters_head(cpython.offsets()) == cpython.symbols["interp_head"]
    if version >= (3, 11):
        assert cpython.version_hex >> 16 == version[0] << 8 | version[1]


def test_ignores_other_files():
    assert detect_cpython("/bin/sh") is None
    assert detect_cpython("/nonexistent/libpython3.11.so.1.0") is None
    assert detect_cpython("/usr/lib/x86_64-linux-gnu/libc.so.6") is None


@pytest.mark.parametrize("name,want", [
    ("python2.7", (2, 7)), ("python3.6m", (3, 6)), ("python3.13", (3, 13)), ("python3.13t", (3, 13)),
    ("libpython3.7m.so.1.0", (3, 7)), ("libpython3.12.so", (3, 12)), ("libpython2.7.so.1.0", (2, 7)),
    ("libpython3.so", None), ("python3", None), ("python3.11-config", None), ("libpython3.11.a", None),
])
def test_version_from_name(name, want):
    from receivers.profiling.python.detect import version_from_name
    got = version_from_name(name)
    assert (got[:2] if got else None) == want



@pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils' objcopy is missing")
@pytest.mark.parametrize("version", [(2, 7), (3, 6)], ids=lambda v: f"{v[0]}.{v[1]}")
def test_static_interp_head_from_a_debug_file(version, tmp_path):
    """2.7 and 3.6 keep interp_head in .symtab only: stripped, it comes from the debug file named
    by .gnu_debuglink (checked to be of the same build), and the file is read through an fd."""
    found = dict(installed_versions())
    if version not in found:
        pytest.skip(f"CPython {version[0]}.{version[1]} is not installed under {PYENV}")
    library = next((found[version] / "lib").glob(f"libpython{version[0]}.{version[1]}*.so.1*"))
    debug, stripped = tmp_path / "libpython.debug", tmp_path / library.name
    subprocess.run(["objcopy", "--only-keep-debug", str(library), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", str(library), str(stripped)], check=True)
    whole = detect_cpython(str(library))
    fd = os.open(stripped, os.O_RDONLY)
    try:
        assert detect_cpython(str(stripped), fd=fd, debug_dirs=()) == dataclasses.replace(whole, path=str(stripped))
        debug.unlink()
        assert detect_cpython(str(stripped), fd=fd, debug_dirs=()) is None
    finally:
        os.close(fd)


def test_a_file_named_python_that_is_not(tmp_path):
    impostor = tmp_path / "python3.12"
    shutil.copy("/bin/true", impostor)
    assert detect_cpython(str(impostor)) is None


def test_debug_offsets_layout_of_314():
    """No 3.14 here to run: a struct built from 3.14's header (Include/internal/
    pycore_debug_offsets.h, v3.14.0) by section and field position, each field's value naming its
    position (100 * section + field), must land in the right Offsets fields."""
    # Fields per section, in order: runtime_state, interpreter_state (threads_main after
    # threads_head; code_object_generation, tlbc_generation at the end), thread_state,
    # interpreter_frame (+ stackpointer, tlbc_index), code_object (+ co_tlbc), pyobject,
    # type_object, tuple, list, set (new), dict, float, long, bytes, unicode, gc, gen_object,
    # llist_node and debugger_support (these two without a size).
    counts = [3, 16, 9, 8, 11, 2, 4, 3, 3, 4, 3, 2, 3, 3, 4, 2, 4, 2, 6]
    words = []
    for section, count in enumerate(counts):
        sized = section < 17
        words += [10_000 if sized and field == 0 else 100 * section + field for field in range(count)]
    data = b"xdebugpy" + (0x030E00F0).to_bytes(8, "little") + (0).to_bytes(8, "little")
    data += b"".join(w.to_bytes(8, "little") for w in words)
    offsets = read_debug_offsets(data)
    assert offsets.version == (3, 14) and len(data) <= offsets_module.DEBUG_OFFSETS_MAX_SIZE
    assert (offsets.runtime_interpreters_head, offsets.interpreter_next, offsets.interpreter_threads_head) == (2, 102, 103)
    assert (offsets.thread_next, offsets.thread_interpreter, offsets.thread_frame) == (202, 203, 204)
    assert (offsets.thread_id, offsets.thread_native_id) == (205, 206)
    assert (offsets.frame_previous, offsets.frame_code, offsets.frame_instruction, offsets.frame_owner) == (301, 302, 303, 305)
    assert (offsets.code_filename, offsets.code_name, offsets.code_qualname, offsets.code_linetable) == (401, 402, 403, 404)
    assert (offsets.code_firstlineno, offsets.code_argcount, offsets.code_instructions) == (405, 406, 409)
    assert offsets.object_type == 501
    assert (offsets.bytes_size, offsets.bytes_data) == (1301, 1302)
    assert (offsets.unicode_state, offsets.unicode_length, offsets.unicode_ascii_data) == (1401, 1402, 1403)
    # What the struct does not say, from 3.14's headers: FRAME_OWNED_BY_CSTACK is 4 (3 is the
    # interpreter's base frame), f_executable is a tagged _PyStackRef.
    assert (offsets.frame_owner_c_stack, offsets.frame_owner_interpreter, offsets.frame_code_tag_mask) == (4, 3, 3)
    assert (offsets.unicode_kind_shift, offsets.unicode_compact_bit, offsets.unicode_ascii_bit) == (2, 5, 6)
    # Free-threaded (3.14t): `interned` is a whole byte, the kind follows it.
    threaded = read_debug_offsets(data[:16] + (1).to_bytes(8, "little") + data[24:])
    assert threaded.free_threaded and (threaded.unicode_kind_shift, threaded.unicode_compact_bit) == (8, 11)
