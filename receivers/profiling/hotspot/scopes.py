"""The methods C1 and C2 inlined at a pc of compiled Java code, as the JVM itself records them for
deoptimization and stack walks: the nmethod holding the pc (found in the code heap's segment map,
as the kernel finds it), its PcDescs (a pc offset and where the pc's scope chain is encoded), and
the scope chain, each scope a Method (an index into the nmethod's metadata), a bytecode index and
the offset of its caller's scope, in the JVM's UNSIGNED5 compressed stream.

An nmethod is freed and its memory reused as the JVM runs: what was read is kept by the nmethod's
address and used only while its compile id (unique in the JVM's life) is still there."""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from ..processes.memory import ProcessExited
from .jvm import CodeCacheLayout
from .vmstructs import VMStructs, VMStructsError

SEGMAP_STEPS = 12  # as the kernel's walk (bpf/hotspot.bpf.c)
MAX_PC_DESCS = 1 << 16
MAX_SCOPES_BYTES = 256 << 10
MAX_INLINED = 64
MAX_METADATA = 1 << 16  # entries of an nmethod's metadata a scope may name
MAX_NMETHODS = 4096
MAX_HELD_BYTES = 32 << 20  # scopes data kept for all of a JVM's nmethods


class ScopeReadError(Exception):
    pass


@dataclass(frozen=True)
class ScopeLayout:
    """Where an nmethod keeps its PcDescs, scopes and metadata. Up to JDK 22 (``immutable`` off):
    the PcDescs from _scopes_pcs_offset to _dependencies_offset and the metadata at
    _metadata_offset, all from the nmethod, the scopes at the _scopes_data_begin pointer. JDK 25:
    the PcDescs from _scopes_pcs_offset to _scopes_data_offset of the nmethod's _immutable_data,
    the scopes from there, the metadata past the relocations of its _mutable_data."""

    name: int  # CodeBlob::_name
    code_begin: int  # CodeBlob::_code_begin (a pointer), or _code_offset (an int from the blob)
    code_begin_is_offset: bool
    method: int  # CompiledMethod::_method, nmethod::_method
    compile_id: int  # nmethod::_compile_id
    scopes_pcs_offset: int  # nmethod::_scopes_pcs_offset (an int)
    pcs_end_offset: int  # nmethod::_dependencies_offset, or _scopes_data_offset (immutable)
    scopes_data: int  # CompiledMethod::_scopes_data_begin, or nmethod::_immutable_data (both pointers)
    metadata: int  # nmethod::_metadata_offset (an int), or CodeBlob::_mutable_data (a pointer, immutable)
    relocation_size: int  # CodeBlob::_relocation_size (immutable)
    immutable: bool
    pc_desc_size: int
    pc_offset: int  # PcDesc::_pc_offset
    scope_decode_offset: int  # PcDesc::_scope_decode_offset
    excludes_zero: bool  # JDK 20+: UNSIGNED5 bytes are never zero (each is stored plus one)


def scope_layout(tables: VMStructs, major: int) -> ScopeLayout | None:
    """None where the JVM keeps these in a way not read here (JDK 23 and 24)."""
    fields = tables.fields

    first = tables.offset
    immutable = ("nmethod", "_immutable_data") in fields
    common = {"name": first(("CodeBlob", "_name")), "code_begin": first(("CodeBlob", "_code_begin"), ("CodeBlob", "_code_offset")),
              "method": first(("CompiledMethod", "_method"), ("nmethod", "_method")), "compile_id": first(("nmethod", "_compile_id")),
              "scopes_pcs_offset": first(("nmethod", "_scopes_pcs_offset")), "pc_offset": first(("PcDesc", "_pc_offset")),
              "scope_decode_offset": first(("PcDesc", "_scope_decode_offset"))}
    if immutable:
        placement = {"pcs_end_offset": first(("nmethod", "_scopes_data_offset")), "scopes_data": first(("nmethod", "_immutable_data")),
                     "metadata": first(("CodeBlob", "_mutable_data")), "relocation_size": first(("CodeBlob", "_relocation_size"))}
    else:
        placement = {"pcs_end_offset": first(("nmethod", "_dependencies_offset")), "scopes_data": first(("CompiledMethod", "_scopes_data_begin")),
                     "metadata": first(("nmethod", "_metadata_offset")), "relocation_size": 0}
    if None in common.values() or None in placement.values() or "PcDesc" not in tables.types:
        return None
    return ScopeLayout(**common, **placement, code_begin_is_offset=("CodeBlob", "_code_begin") not in fields, immutable=immutable,
                       pc_desc_size=tables.types["PcDesc"], excludes_zero=major >= 20)


@dataclass(frozen=True)
class Nmethod:
    address: int
    compile_id: int
    method: int
    code_begin: int
    pc_offsets: tuple[int, ...]  # PcDescs, by pc offset
    scope_offsets: tuple[int, ...]
    metadata: int  # the metadata array (Method * and the rest)
    scopes: bytes  # the scopes data, from its start

    def scope_offset(self, pc: int, return_address: bool) -> int | None:
        """Where the scope chain of ``pc`` starts: a return address's PcDesc is recorded at it
        (no byte back); another pc takes the first PcDesc after it, as the JVM's own sampler
        does: the first at or after it (PcDescs sit at calls and safepoint polls, the poll ending
    the code it runs in)."""
        offset = pc - self.code_begin
        if return_address:
            at = bisect.bisect_left(self.pc_offsets, offset)
            return self.scope_offsets[at] if at < len(self.pc_offsets) and self.pc_offsets[at] == offset else None
        at = bisect.bisect_left(self.pc_offsets, offset)  # (the first at or after it)
        if at == len(self.pc_offsets):
            at -= 1
        return self.scope_offsets[at] if at >= 0 else None


class ScopeReader:
    """One JVM's nmethods, read as their pcs are asked for."""

    def __init__(self, read, code: CodeCacheLayout, layout: ScopeLayout) -> None:
        self.read, self.code, self.layout = read, code, layout
        self._nmethods: dict[int, Nmethod] = {}
        self._held = 0  # bytes of scopes data kept
        self._blob_names: dict[int, str] = {}
        self._this_report: dict[tuple[int, int, bool], list[tuple[int, int]]] = {}
        self._last_report: dict[tuple[int, int, bool], list[tuple[int, int]]] = {}

    def new_report(self) -> None:
        self._last_report, self._this_report = self._this_report, {}

    def inlined(self, pc: int, method: int, return_address: bool) -> list[tuple[int, int]]:
        """(Method, bci) of each scope at ``pc``, innermost first, the outermost being the
        nmethod's own method (which the kernel recorded: ``method``). Empty when unknown. A
        report's stacks share most of their pcs: each is read once a report. Once the JVM has
        exited, what the last report read is kept."""
        key = (pc, method, return_address)
        if key not in self._this_report:
            try:
                self._this_report[key] = self._inlined(pc, method, return_address)
            except ProcessExited:
                if key not in self._last_report:
                    raise
                self._this_report[key] = self._last_report[key]
        return self._this_report[key]

    def _inlined(self, pc: int, method: int, return_address: bool) -> list[tuple[int, int]]:
        nmethod = self._nmethod(pc - (1 if return_address else 0))
        if nmethod is None or nmethod.method != method:
            return []
        offset = nmethod.scope_offset(pc, return_address)
        out: list[tuple[int, int]] = []
        while offset and len(out) < MAX_INLINED:
            sender, method_index, bci, _ = self._decode(nmethod, offset)
            if not 0 < method_index <= MAX_METADATA:
                break
            out.append((self._u64(nmethod.metadata + 8 * (method_index - 1)), bci))
            if sender >= offset:  # callers are encoded before their callees: anything else is not the JVM's
                break
            offset = sender
        return out

    def blob_name(self, pc: int) -> str | None:
        """The name of the CodeBlob holding ``pc`` (kept: a code cache has a few hundred stubs)."""
        blob = self._blob(pc)
        if blob is None:
            return None
        if blob not in self._blob_names:
            if len(self._blob_names) >= MAX_NMETHODS:
                self._blob_names.pop(next(iter(self._blob_names)))
            data = self.read(self._u64(blob + self.layout.name), 64)
            self._blob_names[blob] = data.split(b"\0", 1)[0].decode("ascii", "replace")
        return self._blob_names[blob]

    def _decode(self, nmethod: Nmethod, offset: int) -> tuple[int, int, int, int]:
        values, at = [], offset
        for _ in range(3):
            value, at = _unsigned5(nmethod.scopes, at, self.layout.excludes_zero)
            values.append(value)
        sender, method_index, bci = values
        return sender, method_index, bci - 1, at  # (bci is stored plus one: InvocationEntryBci is -1)

    def _u64(self, address: int) -> int:
        return struct.unpack("<Q", self.read(address, 8))[0]

    def _nmethod(self, pc: int) -> Nmethod | None:
        blob = self._blob(pc)
        if blob is None:
            return None
        layout = self.layout
        compile_id = struct.unpack("<i", self.read(blob + layout.compile_id, 4))[0]
        known = self._nmethods.get(blob)
        if known is not None and known.compile_id == compile_id:
            return known
        if self.read(self._u64(blob + layout.name), 8) != b"nmethod\0":
            return None
        int_at = lambda offset: struct.unpack("<i", self.read(blob + offset, 4))[0]  # noqa: E731
        pcs, pcs_end = int_at(layout.scopes_pcs_offset), int_at(layout.pcs_end_offset)
        if layout.immutable:  # (JDK 25: in the immutable data, which the scopes follow)
            base = self._u64(blob + layout.scopes_data)
            scopes_begin = base + pcs_end
            metadata = self._u64(blob + layout.metadata) + int_at(layout.relocation_size)
        else:
            base = blob
            scopes_begin = self._u64(blob + layout.scopes_data)
            metadata = blob + int_at(layout.metadata)
        count = (pcs_end - pcs) // layout.pc_desc_size
        if not 0 <= count <= MAX_PC_DESCS:
            raise ScopeReadError(f"an nmethod with {count} PcDescs")
        descs = self.read(base + pcs, count * layout.pc_desc_size)
        entries = sorted((struct.unpack_from("<i", descs, i * layout.pc_desc_size + layout.pc_offset)[0],
                          struct.unpack_from("<i", descs, i * layout.pc_desc_size + layout.scope_decode_offset)[0]) for i in range(count))
        scopes_size = min(MAX_SCOPES_BYTES, max((offset for _, offset in entries), default=0) + 64)
        code_begin = blob + int_at(layout.code_begin) if layout.code_begin_is_offset else self._u64(blob + layout.code_begin)
        nmethod = Nmethod(
            address=blob, compile_id=compile_id, method=self._u64(blob + layout.method), code_begin=code_begin,
            pc_offsets=tuple(pc for pc, _ in entries), scope_offsets=tuple(scope for _, scope in entries),
            metadata=metadata, scopes=self._read_available(scopes_begin, scopes_size),
        )
        old = self._nmethods.pop(blob, None)
        self._held -= len(old.scopes) if old is not None else 0
        while self._nmethods and (len(self._nmethods) >= MAX_NMETHODS or self._held + len(nmethod.scopes) > MAX_HELD_BYTES):
            self._held -= len(self._nmethods.pop(next(iter(self._nmethods))).scopes)
        self._nmethods[blob] = nmethod
        self._held += len(nmethod.scopes)
        return nmethod

    def _read_available(self, address: int, size: int) -> bytes:
        """Up to ``size`` bytes: the scopes data ends where the nmethod does, maybe on a page end."""
        try:
            return self.read(address, size)
        except Exception:  # noqa: BLE001 - shorter, to the page's end
            return self.read(address, max(1, 4096 - address % 4096))

    def _blob(self, pc: int) -> int | None:
        code = self.code
        for heap in code.heaps:
            if heap.low <= pc < heap.high:
                segment = (pc - heap.low) >> code.segment_shift
                for _ in range(SEGMAP_STEPS):
                    back = self.read(heap.segmap + segment, 1)[0]
                    if back == 0xFF or back > segment:
                        return None
                    if back == 0:
                        return heap.low + (segment << code.segment_shift) + code.heap_block_size
                    segment -= back
                return None
        return None


def _unsigned5(data: bytes, at: int, excludes_zero: bool) -> tuple[int, int]:
    """One number of the JVM's compressed streams (UNSIGNED5): a byte below L ends it, each byte
    adds its value 6 bits further up, five at most. From JDK 20 no byte is zero: each is stored
    plus one, and L is 191 rather than 192."""
    excluded = 1 if excludes_zero else 0
    low = 256 - 64 - excluded
    value = 0
    for index in range(5):
        if at >= len(data):
            raise ScopeReadError("a scope past the data read")
        byte = data[at] - excluded
        at += 1
        value += byte << (6 * index)
        if byte < low:
            return value, at
    return value, at


__all__ = ["ScopeReader", "ScopeReadError", "scope_layout", "VMStructsError"]
