"""Where V8 keeps what the walker and the namer read: a frame's slots, a heap object's map, a
JSFunction's SharedFunctionInfo, its name and script, a string's characters. V8 says it itself
for debuggers in the binary's ``v8dbg_*`` symbols (int32 constants); what a release dropped from
them has a fallback, the value the versions we know hold. A build whose tagging is not the one
read here (pointer compression: 4-byte fields off a cage base) is refused by name."""

from __future__ import annotations

import re
from dataclasses import dataclass


class UnknownLayout(ValueError):
    """V8 here keeps its objects in a way this reader does not know."""


# The instance types of JSFunctions, from JS_FUNCTION_TYPE on: V8 10 to 12 number the class
# constructors, promise and builtin function types after it (15 in all), and say only the first.
FUNCTION_TYPES = 15
# The tagging read here (and in bpf/v8.bpf.c): 8-byte tagged fields, heap objects tagged 01, Smis
# in the upper 32 bits.
_TAGGING = {"TaggedSize": 8, "SystemPointerSize": 8, "HeapObjectTag": 1, "HeapObjectTagMask": 3, "SmiTag": 0,
            "SmiTagMask": 1, "SmiShiftSize": 31}


# V8 12 names a field's type by its handle, ``Tagged<T>``: ``class_Script__name__Tagged_Object_``
# where V8 11 said ``class_Script__name__Object``.
_TAGGED_TYPE = re.compile(r"__Tagged_(\w+)_$")


def canonical_names(values: dict[str, int]) -> dict[str, int]:
    """The ``v8dbg_*`` values (names without the prefix) with each field's type spelled as V8 11
    spells it, which is how this module asks for them."""
    return {_TAGGED_TYPE.sub(r"__\1", name): value for name, value in values.items()}


@dataclass(frozen=True)
class V8Layout:
    fp_context: int
    fp_function: int
    fp_bytecode_offset: int
    fp_bytecode_array: int
    object_map: int  # HeapObject.map
    map_instance_type: int  # Map.instance_type (u16)
    function_shared: int  # JSFunction.shared
    first_function_type: int
    last_function_type: int
    shared_type: int  # SHARED_FUNCTION_INFO_TYPE
    script_type: int
    scope_info_type: int
    bytecode_array_type: int
    fixed_array_type: int  # (-1 where the metadata does not say: then frames have no lines)
    byte_array_types: tuple[int, int]  # ByteArray's, and V8 12's TrustedByteArray's (-1 where not said)
    shared_name_or_scope_info: int
    shared_script_or_debug_info: int
    shared_function_data: int
    script_name: int
    script_source: int
    script_line_ends: int
    scope_info_first_vars: int  # ScopeInfo slots (a slot is 8 bytes after the map)
    scope_info_context_locals: int
    fixed_array_length: int
    fixed_array_data: int
    bytecode_array_data: int  # where a BytecodeArray's bytecodes start (its header size)
    bytecode_array_source_positions: int
    first_nonstring_type: int
    string_length: int
    string_representation_mask: int
    string_encoding_mask: int
    one_byte_string_tag: int
    seq_string_tag: int
    cons_string_tag: int
    thin_string_tag: int
    sliced_string_tag: int
    seq_one_byte_chars: int
    seq_two_byte_chars: int
    cons_first: int
    cons_second: int
    thin_actual: int
    sliced_parent: int
    sliced_offset: int

    @classmethod
    def from_symbols(cls, values: dict[str, int], version: tuple[int, int, int]) -> V8Layout:
        """From the ``v8dbg_*`` values (names without the prefix) of a V8 ``version``."""
        for name, expected in _TAGGING.items():
            if values.get(name, expected) != expected:
                raise UnknownLayout(f"V8 {'.'.join(map(str, version))}: v8dbg_{name} is {values[name]}, not {expected} "
                                    "(a build with pointer compression): its frames are not walked")

        def value(name: str, fallback: int | None = None) -> int:
            found = values.get(name, fallback)
            if found is None:
                raise UnknownLayout(f"V8 {'.'.join(map(str, version))}: no v8dbg_{name}")
            return found

        function_type = value("type_JSFunction__JS_FUNCTION_TYPE")
        # A BytecodeArray's source position table: the metadata lost its name in 9.4. Until V8 11 it
        # is 24 bytes past the FixedArrayBase length; V8 12 puts it right after the wrapper (the
        # array became a trusted object, that the heap reaches through a BytecodeWrapper).
        length = value("class_FixedArrayBase__length__SMI", 8)
        wrapper = values.get("class_BytecodeArray__wrapper__BytecodeWrapper")
        positions = length + 24 if wrapper is None else wrapper + 8
        layout = cls(
            fp_context=value("off_fp_context", -8),
            fp_function=value("off_fp_function", -16),
            fp_bytecode_offset=value("off_fp_bytecode_offset", -40),
            fp_bytecode_array=value("off_fp_bytecode_array", -32),
            object_map=value("class_HeapObject__map__Map", 0),
            map_instance_type=value("class_Map__instance_type__uint16_t"),
            function_shared=value("class_JSFunction__shared__SharedFunctionInfo"),
            first_function_type=value("FirstJSFunctionType", function_type),
            last_function_type=value("LastJSFunctionType", function_type + FUNCTION_TYPES - 1),
            shared_type=value("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"),
            script_type=value("type_Script__SCRIPT_TYPE"),
            scope_info_type=value("type_ScopeInfo__SCOPE_INFO_TYPE"),
            bytecode_array_type=value("type_BytecodeArray__BYTECODE_ARRAY_TYPE"),
            fixed_array_type=values.get("type_FixedArray__FIXED_ARRAY_TYPE", -1),
            byte_array_types=(values.get("type_ByteArray__BYTE_ARRAY_TYPE", -1),
                              values.get("type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE", -1)),
            shared_name_or_scope_info=value("class_SharedFunctionInfo__name_or_scope_info__Object",
                                            values.get("class_SharedFunctionInfo__name_or_scope_info__NameOrScopeInfoT")),
            # (V8 12 keeps debug info elsewhere: the field holds the script alone)
            shared_script_or_debug_info=value("class_SharedFunctionInfo__script_or_debug_info__HeapObject",
                                              values.get("class_SharedFunctionInfo__script_or_debug_info__Object",
                                                         values.get("class_SharedFunctionInfo__script__HeapObject"))),
            shared_function_data=value("class_SharedFunctionInfo__function_data__Object", 8),
            script_name=value("class_Script__name__Object"),
            script_source=value("class_Script__source__Object"),
            script_line_ends=value("class_Script__line_ends__Object"),
            scope_info_first_vars=value("scopeinfo_idx_first_vars"),
            scope_info_context_locals=value("scopeinfo_idx_ncontextlocals"),
            fixed_array_length=length,
            fixed_array_data=value("class_FixedArray__data__uintptr_t", 16),
            bytecode_array_data=value("class_BytecodeArray__data__uintptr_t"),
            bytecode_array_source_positions=value("class_BytecodeArray__source_position_table__Object", positions),
            first_nonstring_type=value("FirstNonstringType"),
            string_length=value("class_String__length__int32_t"),
            string_representation_mask=value("StringRepresentationMask"),
            string_encoding_mask=value("StringEncodingMask"),
            one_byte_string_tag=value("OneByteStringTag"),
            seq_string_tag=value("SeqStringTag", 0),
            cons_string_tag=value("ConsStringTag"),
            thin_string_tag=value("ThinStringTag"),
            sliced_string_tag=value("SlicedStringTag"),
            seq_one_byte_chars=value("class_SeqOneByteString__chars__char"),
            seq_two_byte_chars=value("class_SeqTwoByteString__chars__char"),
            cons_first=value("class_ConsString__first__String"),
            cons_second=value("class_ConsString__second__String"),
            thin_actual=value("class_ThinString__actual__String"),
            sliced_parent=value("class_SlicedString__parent__String"),
            sliced_offset=value("class_SlicedString__offset__SMI"),
        )
        layout.check()
        return layout

    def check(self) -> None:
        """The bounds the kernel's reads rely on (bpf/v8.bpf.c reads 64 bytes below a frame
        pointer, and fields within 4 KiB of an object)."""
        for name in ("fp_context", "fp_function", "fp_bytecode_offset"):
            offset = getattr(self, name)
            if not (-64 <= offset < 0 and offset % 8 == 0):
                raise UnknownLayout(f"V8 frame slot {name} at {offset}: not within the 64 bytes below the frame pointer")
        for name in ("map_instance_type", "function_shared"):
            if not 0 <= getattr(self, name) < 4096:
                raise UnknownLayout(f"V8 field {name} at {getattr(self, name)}: beyond 4 KiB")
        if not 0 <= self.first_function_type <= self.last_function_type < 1 << 16:
            raise UnknownLayout(f"V8 JSFunction types {self.first_function_type}..{self.last_function_type}")


@dataclass(frozen=True)
class CodeLayout:
    """What finding the functions inlined at a pc reads (code.py). From V8 11.1 a Code object
    points to an InstructionStream that holds the instructions; before, the Code object holds
    them itself, after its header (then ``stream_type`` is the Code's own type and
    ``instruction_start`` is -1: the instructions start where the header ends)."""

    code_type: int
    stream_type: int  # the type of the object the instructions follow
    stream_header: int  # bytes from that object to its instructions
    deoptimization_data: int  # Code fields
    source_positions: int
    instruction_start: int  # (-1: the Code holds its instructions)
    flags: int
    instruction_size: int
    kind_mask: int
    kind_shift: int
    optimized_kinds: tuple[int, ...]  # Maglev's and TurboFan's code kinds
    baseline_kind: int  # Sparkplug's: its pcs map to bytecodes (its bytecode offset table)
    array_length: int  # FixedArrayBase.length, a Smi
    array_data: int  # where a FixedArray's (and a ByteArray's) elements start
    deopt_inlined_count: int  # DeoptimizationData entries
    deopt_literals: int
    deopt_inlining_positions: int
    bytecode_sizes: tuple[bytes, bytes, bytes] | None = None  # Bytecodes::kBytecodeSizes (detect.py), for baseline code's lines

    @property
    def code_holds_instructions(self) -> bool:
        return self.instruction_start < 0

    @classmethod
    def from_symbols(cls, values: dict[str, int], version: tuple[int, int, int]) -> CodeLayout | None:
        """None where the metadata lacks what has no fallback: then optimized frames are named by
        their function alone."""
        baseline = values.get("CodeKindBaseline")
        if baseline is None or "type_Code__CODE_TYPE" not in values:
            return None
        if version < (11, 1, 0):
            return cls._holding_instructions(values, baseline)
        if "type_InstructionStream__INSTRUCTION_STREAM_TYPE" not in values:
            return None
        # The Code fields V8 11.x leaves out of its metadata follow the source position table's:
        # deoptimization data before it, then the InstructionStream, the instruction start (a
        # pointer), the flags and the instruction size (4 bytes further apart before 11.4.59).
        # V8 12 says the fields after the table (from its wrapper on) and not the table, which
        # lies before the wrapper.
        positions = values.get("class_Code__source_position_table__ByteArray")
        if positions is None and "class_Code__wrapper__CodeWrapper" in values:
            positions = values["class_Code__wrapper__CodeWrapper"] - 8
        if positions is None:
            return None
        start = values.get("class_Code__instruction_start__uintptr_t",
                           values.get("class_Code__instruction_start__Address", positions + 16))
        flags = values.get("class_Code__flags__uint32_t", start + 8)
        return cls(
            stream_type=values["type_InstructionStream__INSTRUCTION_STREAM_TYPE"],
            stream_header=values.get("class_InstructionStream__instruction_start__uintptr_t", 16),
            deoptimization_data=values.get("class_Code__deoptimization_data__FixedArray", positions - 8),
            source_positions=positions,
            instruction_start=start,
            flags=flags,
            instruction_size=values.get("class_Code__instruction_size__int", flags + (4 if version >= (11, 4, 59) else 8)),
            **cls._common(values, baseline),
        )

    @classmethod
    def _holding_instructions(cls, values: dict[str, int], baseline: int) -> CodeLayout | None:
        """V8 10: the Code's header (its size is where the metadata says its instructions start)
        holds relocation info, deoptimization data, the source position table and a data
        container's pointer, then the instruction size and the flags."""
        header = values.get("class_Code__instruction_start__uintptr_t")
        if header is None or "class_Code__instruction_size__int" not in values or "class_Code__flags__uint32_t" not in values:
            return None
        deoptimization_data = values.get("class_Code__deoptimization_data__FixedArray", 16)
        return cls(
            stream_type=values["type_Code__CODE_TYPE"],
            stream_header=header,
            deoptimization_data=deoptimization_data,
            source_positions=values.get("class_Code__source_position_table__ByteArray", deoptimization_data + 8),
            instruction_start=-1,
            flags=values["class_Code__flags__uint32_t"],
            instruction_size=values["class_Code__instruction_size__int"],
            **cls._common(values, baseline),
        )

    @staticmethod
    def _common(values: dict[str, int], baseline: int) -> dict[str, int | tuple[int, ...]]:
        return dict(
            code_type=values["type_Code__CODE_TYPE"],
            kind_mask=values.get("CodeKindFieldMask", 15),
            kind_shift=values.get("CodeKindFieldShift", 0),
            optimized_kinds=(baseline + 1, baseline + 2),
            baseline_kind=baseline,
            array_length=values.get("class_FixedArrayBase__length__SMI", 8),
            array_data=values.get("class_FixedArray__data__uintptr_t", 16),
            deopt_inlined_count=values.get("DeoptimizationDataInlinedFunctionCountIndex", 1),
            deopt_literals=values.get("DeoptimizationDataLiteralArrayIndex", 2),
            deopt_inlining_positions=values.get("DeoptimizationDataInliningPositionsIndex", 7),
        )
