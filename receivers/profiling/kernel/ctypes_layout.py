"""ctypes types as plain data and back: the key, value and event layouts BCC derives from the BPF
program's C, kept in the compiled program's cache file and rebuilt without BCC.

A layout is JSON: a simple type by its ctypes name ("c_uint"), ``{"array": layout, "length": n}``,
or ``{"struct"|"union": [[name, layout] or [name, layout, bits], ...], "pack": n, "anonymous": [...]}``.
``build`` refuses anything else (a cache file is read as untrusted until it proves well formed).
"""

from __future__ import annotations

import ctypes as ct

_SIMPLE = {name: getattr(ct, name) for name in (
    "c_bool", "c_char", "c_byte", "c_ubyte", "c_short", "c_ushort", "c_int", "c_uint", "c_long", "c_ulong",
    "c_longlong", "c_ulonglong", "c_int8", "c_uint8", "c_int16", "c_uint16", "c_int32", "c_uint32", "c_int64",
    "c_uint64", "c_float", "c_double", "c_longdouble", "c_char_p", "c_void_p", "c_size_t", "c_ssize_t")}
_NAME_OF = {kind: name for name, kind in reversed(list(_SIMPLE.items()))}  # (aliases: the first name wins)

MAX_DEPTH = 16
MAX_LENGTH = 1 << 24
MAX_BYTES = 1 << 26
MAX_FIELDS = 4096


class LayoutError(ValueError):
    """A layout that does not describe a type this module builds."""


def describe(kind: type) -> object:
    """``kind`` (a ctypes type) as a layout."""
    if issubclass(kind, ct.Array):
        return {"array": describe(kind._type_), "length": kind._length_}
    if issubclass(kind, (ct.Structure, ct.Union)):
        fields = [[field[0], describe(field[1]), *field[2:]] for field in kind._fields_]
        return {"struct" if issubclass(kind, ct.Structure) else "union": fields,
                "pack": getattr(kind, "_pack_", 0), "anonymous": list(getattr(kind, "_anonymous_", ()))}
    if kind in _NAME_OF:
        return _NAME_OF[kind]
    raise LayoutError(f"no layout for {kind!r}")


def build(layout: object, depth: int = 0) -> type:
    """The ctypes type ``layout`` describes; LayoutError when it is not a layout."""
    if depth > MAX_DEPTH:
        raise LayoutError("nested too deep")
    if isinstance(layout, str):
        if layout not in _SIMPLE:
            raise LayoutError(f"unknown simple type {layout!r}")
        return _SIMPLE[layout]
    if not isinstance(layout, dict):
        raise LayoutError(f"not a layout: {type(layout).__name__}")
    if set(layout) == {"array", "length"}:
        length = layout["length"]
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= MAX_LENGTH:
            raise LayoutError(f"array length {length!r}")
        element = build(layout["array"], depth + 1)
        if ct.sizeof(element) * length > MAX_BYTES:
            raise LayoutError(f"an array of {length} x {ct.sizeof(element)} bytes")
        return element * length
    kinds = {"struct": ct.Structure, "union": ct.Union}
    if len(layout) != 3 or "pack" not in layout or "anonymous" not in layout or not set(layout) & set(kinds):
        raise LayoutError(f"unknown layout keys {sorted(layout)}")
    kind_name = next(name for name in kinds if name in layout)
    fields, pack, anonymous = layout[kind_name], layout["pack"], layout["anonymous"]
    if not isinstance(fields, list) or len(fields) > MAX_FIELDS:
        raise LayoutError("fields: not a list, or too many")
    if not isinstance(pack, int) or isinstance(pack, bool) or pack not in (0, 1, 2, 4, 8, 16):
        raise LayoutError(f"pack {pack!r}")
    built = []
    for field in fields:
        if not isinstance(field, list) or len(field) not in (2, 3) or not isinstance(field[0], str):
            raise LayoutError(f"field {field!r}")
        member = [field[0], build(field[1], depth + 1)]
        if len(field) == 3:
            if not isinstance(field[2], int) or isinstance(field[2], bool) or not 0 < field[2] <= 64:
                raise LayoutError(f"bit width {field[2]!r}")
            member.append(field[2])
        built.append(tuple(member))
    names = [field[0] for field in built]
    if not isinstance(anonymous, list) or not all(isinstance(name, str) and name in names for name in anonymous):
        raise LayoutError(f"anonymous {anonymous!r}")
    namespace: dict[str, object] = {}  # (_pack_ and _anonymous_ before _fields_, which ctypes lays out)
    if pack:
        namespace["_pack_"] = pack
    if anonymous:
        namespace["_anonymous_"] = anonymous
    namespace["_fields_"] = built
    try:
        return type("", (kinds[kind_name],), namespace)
    except (TypeError, ValueError, AttributeError) as error:  # (what ctypes itself refuses)
        raise LayoutError(str(error)) from error
