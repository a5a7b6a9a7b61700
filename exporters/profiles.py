"""What the exporters that show profiles (debug, flamegraph, pprof) read the same way: how many
samples a sample stands for, and the name of a frame that has no symbol."""

from __future__ import annotations

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import SampleView
from pycollector.pdata.zero_entries import with_zero_entries


def sample_value(view: SampleView) -> int:
    """The sum of the sample's values or, when it has none, one per timestamp: the OTel eBPF
    profiler sends each CPU sample as a timestamp and no value."""
    return sum(view.values) if view.values else len(view.sample.timestamps_unix_nano)


def unsymbolized_name(address: int, filename: str = "", memory_start: int = 0, file_offset: int = 0) -> str:
    """A name for a frame with no function: ``[libfoo.so]+0x56cd``, the file's base name and the
    address in the file (address - mapping start + file offset, what ``addr2line -e`` takes for a
    shared library or PIE), or ``[unknown]+0x7f3a...`` with no file. Viewers that drop frames
    without a name (speedscope) then show every sample."""
    if not filename:
        return f"[unknown]+0x{address:x}"
    base = filename.rsplit("/", 1)[-1]
    if not (base.startswith("[") and base.endswith("]")):  # "[vdso]", "[kernel.kallsyms]" already are
        base = f"[{base}]"
    in_file = address - memory_start + file_offset if address >= memory_start else address
    return f"{base}+0x{in_file:x}"


def location_name(dictionary: profiles_pb2.ProfilesDictionary, location: profiles_pb2.Location) -> str:
    """``unsymbolized_name`` of a location of ``dictionary``, from its mapping (index 0: none)."""
    if not location.mapping_index:
        return unsymbolized_name(location.address)
    mapping = dictionary.mapping_table[location.mapping_index]
    return unsymbolized_name(location.address, dictionary.string_table[mapping.filename_strindex], mapping.memory_start, mapping.file_offset)


def with_source_line(function: str, filename: str, line: int) -> str:
    """``spin_heavy (known_split.py:16)``: a frame of interpreted code named as py-spy names it,
    the file's base name and the line; a name without both stays as it is."""
    if not function or not filename or not line:
        return function
    return f"{function} ({filename.rsplit('/', 1)[-1]}:{line})"


class FrameNames:
    """The name of each frame ``iter_samples`` gives for a stack, leaf first, as it gives them (one
    per line of a location, one for a location without lines): the function's, with its source
    file and line where the line has both (``with_source_line``), else ``unsymbolized_name`` of
    the location. Each stack of the dictionary is named once."""

    def __init__(self, dictionary: profiles_pb2.ProfilesDictionary):
        self._dictionary = with_zero_entries(dictionary)
        self._strings = self._dictionary.string_table
        self._locations: dict[int, tuple[str, ...]] = {}
        self._stacks: dict[int, tuple[str, ...]] = {}

    def of_stack(self, stack_index: int) -> tuple[str, ...]:
        names = self._stacks.get(stack_index)
        if names is None:
            location_indices = self._dictionary.stack_table[stack_index].location_indices
            names = self._stacks[stack_index] = tuple(name for index in location_indices for name in self._location(index))
        return names

    def _location(self, index: int) -> tuple[str, ...]:
        names = self._locations.get(index)
        if names is None:
            location = self._dictionary.location_table[index]
            functions = [self._line_name(line) for line in location.lines]
            if not functions or not all(functions):
                fallback = location_name(self._dictionary, location)
                functions = [function or fallback for function in functions] or [fallback]
            names = self._locations[index] = tuple(functions)
        return names

    def _line_name(self, line: profiles_pb2.Line) -> str:
        function = self._dictionary.function_table[line.function_index]
        return with_source_line(self._strings[function.name_strindex], self._strings[function.filename_strindex], line.line)
