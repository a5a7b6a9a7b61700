"""Where CPython keeps what a profiler reads (x86-64): one table per minor version for 2.7 and
3.6 to 3.12, and for 3.13 on the interpreter's own ``_Py_DebugOffsets``.

The kernel walker goes runtime -> interpreter -> its thread list -> the sampled thread's
PyThreadState -> the innermost frame -> each frame's code object and instruction; user space
reads the code object's name, file and line table. Every number in the table is checked against
that version's headers by tests/test_cpython_offsets.py.

From 3.13 the interpreter carries the offsets at the start of ``_PyRuntime`` (the struct begins
with the cookie ``xdebugpy`` and PY_VERSION_HEX), so a new patch release needs nothing here. The
struct itself grows between minor versions (3.14 added fields in the middle), so its layout is
known per minor version (3.13 from 3.13's Include/internal/pycore_runtime.h, 3.14 from its
pycore_debug_offsets.h); an unknown one is refused rather than guessed. A few facts the struct
does not carry (the frame owner values, the tag bits of 3.14's stack references, the bits of a
string's state) are kept per version beside it.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from dataclasses import dataclass


class InstructionKind(enum.Enum):
    """What the frame's instruction field holds, and so what the walker records."""

    LASTI_BYTES = "lasti_bytes"  # f_lasti, an int: byte offset of the last instruction (<= 3.9)
    LASTI_CODE_UNITS = "lasti_code_units"  # f_lasti, an int: in 2-byte code units (3.10)
    POINTER = "pointer"  # prev_instr / instr_ptr: a pointer into the code object (3.11+)


class EntryKind(enum.Enum):
    """How a frame says it is where one call of the eval loop begins (3.11+)."""

    IS_ENTRY = "is_entry"  # 3.11: a bool on the first frame the call runs
    OWNER = "owner"  # 3.12+: a shim frame owned by the C stack sits below that call's frames


class LineTableKind(enum.Enum):
    LNOTAB_UNSIGNED = "lnotab_unsigned"  # 2.7 co_lnotab: (byte increment, line increment) pairs
    LNOTAB = "lnotab"  # 3.6-3.9 co_lnotab: the line increment is signed
    LINETABLE_310 = "linetable_310"  # 3.10 co_linetable: (byte length, signed line delta, -128: none)
    LOCATIONS = "locations"  # 3.11+ co_linetable: the location table, in code units


class StringKind(enum.Enum):
    BYTES = "bytes"  # 2.7: names are PyStringObject (ob_size, ob_sval)
    UNICODE = "unicode"  # 3.x: PyUnicodeObject, compact


@dataclass(frozen=True, slots=True)
class Offsets:
    """Byte offsets of the fields a walker and a code reader use; None where the version has no
    such field."""

    version: tuple[int, int]
    # The thread list: the pointer to the first PyInterpreterState is _PyRuntime +
    # runtime_interpreters_head (3.7+) or the static `interp_head` (2.7, 3.6).
    runtime_interpreters_head: int | None
    interpreter_next: int
    interpreter_threads_head: int  # tstate_head (<= 3.10), threads.head (3.11+)
    thread_next: int
    thread_interpreter: int
    thread_id: int  # pthread_self() of the thread: on x86-64 glibc its fsbase
    thread_native_id: int | None  # the thread's tid (3.11+)
    thread_frame: int  # frame (<= 3.10), cframe (3.11, 3.12), current_frame (3.13+)
    cframe_current_frame: int | None  # _PyCFrame.current_frame, behind thread_frame (3.11, 3.12)
    # Frames: PyFrameObject (<= 3.10), _PyInterpreterFrame (3.11+)
    frame_code: int  # f_code; f_executable (3.13+)
    frame_code_tag_mask: int  # low bits to clear from frame_code's value (3.14's _PyStackRef)
    frame_previous: int  # f_back; previous
    frame_instruction: int  # f_lasti; prev_instr (3.11, 3.12); instr_ptr (3.13+)
    instruction_kind: InstructionKind
    frame_owner: int | None  # a byte: is_entry (3.11), owner (3.12+)
    entry_kind: EntryKind | None
    frame_owner_c_stack: int | None  # owner of the shim frame an eval loop call starts with
    frame_owner_interpreter: int | None  # owner of a thread's base frame, no code (3.14+)
    # Code objects
    object_type: int  # PyObject.ob_type: every code object of a process has the same one
    code_argcount: int  # ints, with the next three the identity check of a cached code object
    code_kwonlyargcount: int | None  # (3.13+: not in _Py_DebugOffsets)
    code_flags: int | None  # (3.13+: not in _Py_DebugOffsets)
    code_firstlineno: int
    code_name: int
    code_qualname: int | None  # 3.11+
    code_filename: int
    code_linetable: int  # co_lnotab (<= 3.9), co_linetable (3.10+): a bytes object
    linetable_kind: LineTableKind
    code_instructions: int | None  # co_code_adaptive (3.11+): index = (ptr - code - this) / 2
    # Strings
    string_kind: StringKind
    bytes_size: int  # PyBytesObject / 2.7 PyStringObject: ob_size
    bytes_data: int  # ob_sval
    unicode_length: int | None
    unicode_state: int | None  # a 32-bit word of bit fields:
    unicode_kind_shift: int | None  # kind (1, 2, 4 bytes a character): 3 bits from here
    unicode_compact_bit: int | None  # characters follow the object header
    unicode_ascii_bit: int | None  # ... right after PyASCIIObject; else after PyCompactUnicodeObject
    unicode_ascii_data: int | None  # sizeof(PyASCIIObject)
    unicode_compact_data: int | None  # sizeof(PyCompactUnicodeObject)
    unicode_legacy_data: int | None  # PyUnicodeObject.data: a pointer, for a string not compact
    free_threaded: bool = False
    version_hex: int | None = None  # PY_VERSION_HEX, when read from the interpreter

    @property
    def interpreter_frames(self) -> bool:
        """Frames are _PyInterpreterFrame (3.11+), whose instruction is a pointer."""
        return self.instruction_kind is InstructionKind.POINTER


# --------------------------------------------------------------------------------------------
# The table: each version as its difference from the one before, so what changed is visible.

_V27 = Offsets(
    version=(2, 7),
    runtime_interpreters_head=None, interpreter_next=0, interpreter_threads_head=8,
    thread_next=0, thread_interpreter=8, thread_id=144, thread_native_id=None, thread_frame=16,
    cframe_current_frame=None,
    frame_code=32, frame_code_tag_mask=0, frame_previous=24, frame_instruction=120,
    instruction_kind=InstructionKind.LASTI_BYTES,
    frame_owner=None, entry_kind=None, frame_owner_c_stack=None, frame_owner_interpreter=None,
    object_type=8, code_argcount=16, code_kwonlyargcount=None, code_flags=28, code_firstlineno=96, code_name=88,
    code_qualname=None, code_filename=80, code_linetable=104, linetable_kind=LineTableKind.LNOTAB_UNSIGNED,
    code_instructions=None,
    string_kind=StringKind.BYTES, bytes_size=16, bytes_data=36,
    unicode_length=None, unicode_state=None, unicode_kind_shift=None, unicode_compact_bit=None,
    unicode_ascii_bit=None, unicode_ascii_data=None, unicode_compact_data=None, unicode_legacy_data=None,
)
_V36 = dataclasses.replace(
    _V27, version=(3, 6),
    thread_next=8, thread_interpreter=16, thread_id=152, thread_frame=24,  # PyThreadState.prev first
    code_kwonlyargcount=20, code_flags=32, code_firstlineno=36, code_name=104, code_filename=96,
    code_linetable=112, linetable_kind=LineTableKind.LNOTAB,
    string_kind=StringKind.UNICODE, bytes_data=32,
    unicode_length=16, unicode_state=32, unicode_kind_shift=2, unicode_compact_bit=5, unicode_ascii_bit=6,
    unicode_ascii_data=48, unicode_compact_data=72, unicode_legacy_data=72,
)
_V37 = dataclasses.replace(_V36, version=(3, 7), runtime_interpreters_head=24, thread_id=176, frame_instruction=104)
_V38 = dataclasses.replace(  # co_posonlyargcount comes in after co_argcount
    _V37, version=(3, 8), runtime_interpreters_head=32,
    code_kwonlyargcount=24, code_flags=36, code_firstlineno=40, code_name=112, code_filename=104, code_linetable=120,
)
_V39 = dataclasses.replace(_V38, version=(3, 9))
_V310 = dataclasses.replace(
    _V39, version=(3, 10), frame_instruction=96, instruction_kind=InstructionKind.LASTI_CODE_UNITS,
    linetable_kind=LineTableKind.LINETABLE_310,
)
_V311 = dataclasses.replace(
    _V310, version=(3, 11),
    runtime_interpreters_head=40, interpreter_threads_head=16, thread_id=152, thread_native_id=160,
    thread_frame=56, cframe_current_frame=8,
    frame_code=32, frame_previous=48, frame_instruction=56, instruction_kind=InstructionKind.POINTER,
    frame_owner=68, entry_kind=EntryKind.IS_ENTRY,
    code_argcount=56, code_kwonlyargcount=64, code_flags=48, code_firstlineno=72, code_name=120,
    code_qualname=128, code_filename=112, code_linetable=136, linetable_kind=LineTableKind.LOCATIONS,
    code_instructions=184,
)
_V312 = dataclasses.replace(  # PyASCIIObject loses wstr
    _V311, version=(3, 12),
    interpreter_threads_head=72, thread_id=136, thread_native_id=144, cframe_current_frame=0,
    frame_code=0, frame_previous=8, frame_owner=70, entry_kind=EntryKind.OWNER, frame_owner_c_stack=3,
    code_argcount=52, code_kwonlyargcount=60, code_firstlineno=68, code_instructions=192,
    unicode_ascii_data=40, unicode_compact_data=56, unicode_legacy_data=56,
)

OFFSETS: dict[tuple[int, int], Offsets] = {o.version: o for o in (_V27, _V36, _V37, _V38, _V39, _V310, _V311, _V312)}
FIRST_WITH_DEBUG_OFFSETS = (3, 13)


def table_offsets(version: tuple[int, int]) -> Offsets | None:
    """The table's offsets for ``version`` (2.7, 3.6 to 3.12), None for any other."""
    return OFFSETS.get(version)


# --------------------------------------------------------------------------------------------
# _Py_DebugOffsets (3.13+)

DEBUG_COOKIE = b"xdebugpy"


class UnknownLayout(ValueError):
    """The bytes are not a _Py_DebugOffsets this module knows how to read."""


# The struct after its cookie, version and free_threaded: sections of u64 fields in order.
_LAYOUT_313 = (
    ("runtime_state", "size finalizing interpreters_head"),
    ("interpreter_state", "size id next threads_head gc imports_modules sysdict builtins ceval_gil "
                          "gil_runtime_state gil_runtime_state_enabled gil_runtime_state_locked gil_runtime_state_holder"),
    ("thread_state", "size prev next interp current_frame thread_id native_thread_id datastack_chunk status"),
    ("interpreter_frame", "size previous executable instr_ptr localsplus owner"),
    ("code_object", "size filename name qualname linetable firstlineno argcount localsplusnames localspluskinds "
                    "co_code_adaptive"),
    ("pyobject", "size ob_type"),
    ("type_object", "size tp_name tp_repr tp_flags"),
    ("tuple_object", "size ob_item ob_size"),
    ("list_object", "size ob_item ob_size"),
    ("dict_object", "size ma_keys ma_values"),
    ("float_object", "size ob_fval"),
    ("long_object", "size lv_tag ob_digit"),
    ("bytes_object", "size ob_size ob_sval"),
    ("unicode_object", "size state length asciiobject_size"),
    ("gc", "size collecting"),
)
_LAYOUT_314 = (
    ("runtime_state", "size finalizing interpreters_head"),
    ("interpreter_state", "size id next threads_head threads_main gc imports_modules sysdict builtins ceval_gil "
                          "gil_runtime_state gil_runtime_state_enabled gil_runtime_state_locked gil_runtime_state_holder "
                          "code_object_generation tlbc_generation"),
    ("thread_state", "size prev next interp current_frame thread_id native_thread_id datastack_chunk status"),
    ("interpreter_frame", "size previous executable instr_ptr localsplus owner stackpointer tlbc_index"),
    ("code_object", "size filename name qualname linetable firstlineno argcount localsplusnames localspluskinds "
                    "co_code_adaptive co_tlbc"),
    ("pyobject", "size ob_type"),
    ("type_object", "size tp_name tp_repr tp_flags"),
    ("tuple_object", "size ob_item ob_size"),
    ("list_object", "size ob_item ob_size"),
    ("set_object", "size used table mask"),
    ("dict_object", "size ma_keys ma_values"),
    ("float_object", "size ob_fval"),
    ("long_object", "size lv_tag ob_digit"),
    ("bytes_object", "size ob_size ob_sval"),
    ("unicode_object", "size state length asciiobject_size"),
    ("gc", "size collecting"),
    ("gen_object", "size gi_name gi_iframe gi_frame_state"),
    ("llist_node", "next prev"),
    ("debugger_support", "eval_breaker remote_debugger_support remote_debugging_enabled debugger_pending_call "
                         "debugger_script_path debugger_script_path_size"),
)
_LAYOUTS = {(3, 13): _LAYOUT_313, (3, 14): _LAYOUT_314}
_HEADER = struct.Struct("<8sQQ")  # cookie, version, free_threaded


def _size(layout) -> int:
    return _HEADER.size + 8 * sum(len(names.split()) for _, names in layout)


DEBUG_OFFSETS_MAX_SIZE = max(_size(layout) for layout in _LAYOUTS.values())  # bytes to read


@dataclass(frozen=True, slots=True)
class _VersionFacts:
    """What _Py_DebugOffsets does not say, per minor version (from that version's headers)."""

    owner_c_stack: int  # FRAME_OWNED_BY_CSTACK
    owner_interpreter: int | None  # FRAME_OWNED_BY_INTERPRETER
    code_tag_mask: int  # f_executable is a _PyStackRef from 3.14: its low bits are tags
    free_threaded_interned_byte: bool  # 3.14t: PyASCIIObject.state.interned is a whole byte


_FACTS = {
    (3, 13): _VersionFacts(owner_c_stack=3, owner_interpreter=None, code_tag_mask=0, free_threaded_interned_byte=False),
    (3, 14): _VersionFacts(owner_c_stack=4, owner_interpreter=3, code_tag_mask=3, free_threaded_interned_byte=True),
}
# sizeof(PyCompactUnicodeObject) - sizeof(PyASCIIObject) since 3.12: utf8_length and utf8.
_COMPACT_EXTRA = 16


def debug_offsets_version(data: bytes) -> int:
    """PY_VERSION_HEX from the start of a _Py_DebugOffsets; UnknownLayout if there is none."""
    if len(data) < _HEADER.size:
        raise UnknownLayout(f"{len(data)} bytes are too few for a _Py_DebugOffsets")
    cookie, version_hex, _ = _HEADER.unpack_from(data)
    if cookie != DEBUG_COOKIE:
        raise UnknownLayout(f"no _Py_DebugOffsets cookie (found {cookie!r})")
    return version_hex


def read_debug_offsets(data: bytes) -> Offsets:
    """Offsets from the bytes of a _Py_DebugOffsets (the start of _PyRuntime, at least
    DEBUG_OFFSETS_MAX_SIZE of them, or the whole struct). UnknownLayout when the cookie is
    missing, the version's layout is not known, or an offset lies outside its struct."""
    version_hex = debug_offsets_version(data)
    version = (version_hex >> 24 & 0xFF, version_hex >> 16 & 0xFF)
    layout = _LAYOUTS.get(version)
    if layout is None:
        known = ", ".join(f"{v[0]}.{v[1]}" for v in _LAYOUTS)
        raise UnknownLayout(f"_Py_DebugOffsets of {version[0]}.{version[1]} (0x{version_hex:08x}): layout unknown (known: {known})")
    if len(data) < _size(layout):
        raise UnknownLayout(f"_Py_DebugOffsets of {version[0]}.{version[1]} needs {_size(layout)} bytes, got {len(data)}")
    free_threaded = bool(_HEADER.unpack_from(data)[2])
    fields: dict[str, dict[str, int]] = {}
    position = _HEADER.size
    for section, names in layout:
        names = names.split()
        fields[section] = dict(zip(names, struct.unpack_from(f"<{len(names)}Q", data, position)))
        position += 8 * len(names)
    _check_within(fields)
    return _from_debug_offsets(version, version_hex, free_threaded, fields)


# The fields used, each checked to lie inside its struct: a wrong layout gives numbers that
# do not (sizes and offsets change places).
_USED = {
    "runtime_state": ("interpreters_head",),
    "interpreter_state": ("next", "threads_head"),
    "thread_state": ("next", "interp", "current_frame", "thread_id", "native_thread_id"),
    "interpreter_frame": ("previous", "executable", "instr_ptr", "owner"),
    "code_object": ("filename", "name", "qualname", "linetable", "firstlineno", "argcount", "co_code_adaptive"),
    "pyobject": ("ob_type",),
    "bytes_object": ("ob_size", "ob_sval"),
    "unicode_object": ("state", "length", "asciiobject_size"),
}


def _check_within(fields: dict[str, dict[str, int]]) -> None:
    for section, names in _USED.items():
        size = fields[section]["size"]
        for name in names:
            value = fields[section][name]
            # co_code_adaptive is the flexible array at the end: it may equal the size.
            limit = size if name == "co_code_adaptive" or name == "asciiobject_size" else size - 1
            if not 0 <= value <= limit or size > 1 << 24:
                raise UnknownLayout(f"_Py_DebugOffsets {section}.{name} = {value} is outside its struct ({size} bytes)")


def _from_debug_offsets(version, version_hex, free_threaded, f) -> Offsets:
    facts = _FACTS[version]
    frame, code, unicode = f["interpreter_frame"], f["code_object"], f["unicode_object"]
    interned_byte = free_threaded and facts.free_threaded_interned_byte
    kind_shift = 8 if interned_byte else 2  # interned: a byte (3.14t) or 2 bits, then kind:3
    ascii_size = unicode["asciiobject_size"]
    return Offsets(
        version=version,
        runtime_interpreters_head=f["runtime_state"]["interpreters_head"],
        interpreter_next=f["interpreter_state"]["next"],
        interpreter_threads_head=f["interpreter_state"]["threads_head"],
        thread_next=f["thread_state"]["next"],
        thread_interpreter=f["thread_state"]["interp"],
        thread_id=f["thread_state"]["thread_id"],
        thread_native_id=f["thread_state"]["native_thread_id"],
        thread_frame=f["thread_state"]["current_frame"],
        cframe_current_frame=None,
        frame_code=frame["executable"],
        frame_code_tag_mask=facts.code_tag_mask,
        frame_previous=frame["previous"],
        frame_instruction=frame["instr_ptr"],
        instruction_kind=InstructionKind.POINTER,
        frame_owner=frame["owner"],
        entry_kind=EntryKind.OWNER,
        frame_owner_c_stack=facts.owner_c_stack,
        frame_owner_interpreter=facts.owner_interpreter,
        object_type=f["pyobject"]["ob_type"],
        code_argcount=code["argcount"],
        code_kwonlyargcount=None,
        code_flags=None,
        code_firstlineno=code["firstlineno"],
        code_name=code["name"],
        code_qualname=code["qualname"],
        code_filename=code["filename"],
        code_linetable=code["linetable"],
        linetable_kind=LineTableKind.LOCATIONS,
        code_instructions=code["co_code_adaptive"],
        string_kind=StringKind.UNICODE,
        bytes_size=f["bytes_object"]["ob_size"],
        bytes_data=f["bytes_object"]["ob_sval"],
        unicode_length=unicode["length"],
        unicode_state=unicode["state"],
        unicode_kind_shift=kind_shift,
        unicode_compact_bit=kind_shift + 3,
        unicode_ascii_bit=kind_shift + 4,
        unicode_ascii_data=ascii_size,
        unicode_compact_data=ascii_size + _COMPACT_EXTRA,
        unicode_legacy_data=ascii_size + _COMPACT_EXTRA,
        free_threaded=free_threaded,
        version_hex=version_hex,
    )
