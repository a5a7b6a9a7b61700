"""A compiled program (compiled.py) into the kernel, without BCC's compiler: its maps created, each
function's map references set to this process's descriptors and the function loaded, and the
attachments BCC would have made at load (a function named ``raw_tracepoint__<name>``, as BCC's
RAW_TRACEPOINT_PROBE names it, runs on that tracepoint).

``LoadedProgram`` is what the sampler holds: maps by name (maps.py), function descriptors, the
cpu-clock and tracepoint attachments, and the perf buffers' poll. ``cleanup()`` detaches and closes
everything; the kernel frees a program and its maps when their last descriptor closes.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import os

from receivers.profiling.kernel import bcc_bpf, uprobes
from receivers.profiling.kernel.compiled import CompiledProgram, FunctionSpec, with_immediates
from receivers.profiling.kernel.maps import BpfMap, map_over
from receivers.profiling.kernel.program import (BPFAttachError, BPFLoadError, BPFPermissionError, SamplerError,
                                                capture_stderr_fd, tail)

PROGRAM_TYPES = {"KPROBE": 2, "PERF_EVENT": 7, "RAW_TRACEPOINT": 17}  # (a uprobe runs a KPROBE program)
# A KPROBE program that uprobe_multi links run (kernel/uprobes.py): loaded with that expected
# attach type, which bcc_prog_load cannot set.
UPROBE_MULTI = "UPROBE_MULTI"
RAW_TRACEPOINT_PREFIX = "raw_tracepoint__"
# BCC attaches these by name at load; a program using one needs the loader to learn it first.
_OTHER_AUTOLOAD_PREFIXES = ("kprobe__", "kretprobe__", "tracepoint__", "kfunc__", "kretfunc__", "lsm__")


class LoadedProgram:
    def __init__(self, compiled: CompiledProgram) -> None:
        self.compiled = compiled
        self.log = ""  # what the verifier printed (asked for with a log level, or on a refusal)
        self.compile_seconds: float | None = None  # set by program.load when it had to compile
        self._lib = bcc_bpf.lib()
        self._map_fds: dict[str, int] = {}
        self._maps: dict[str, BpfMap] = {}
        self._program_fds: dict[str, int] = {}
        self._perf_event_fds: list[int] = []
        self._tracepoint_fds: list[int] = []
        self._readers: dict[tuple[str, int], int] = {}  # (map, cpu) -> perf reader

    @classmethod
    def load(cls, compiled: CompiledProgram, functions: dict[bytes, str], log_level: int = 0) -> LoadedProgram:
        """The maps created and ``functions`` (name -> "PERF_EVENT" or "RAW_TRACEPOINT") loaded, with
        the functions BCC would attach by name. Raises BPFLoadError (BPFPermissionError when
        refused for privileges); nothing stays loaded when it does."""
        try:
            loaded = cls(compiled)
        except OSError as error:  # (libbcc_bpf missing)
            raise SamplerError(str(error)) from error
        try:
            loaded._create_maps()
            for name, program_type in functions.items():
                try:
                    function = compiled.function(name.decode())
                except KeyError as error:
                    raise BPFLoadError(str(error)) from None
                loaded._load_function(function, PROGRAM_TYPES.get(program_type, PROGRAM_TYPES["KPROBE"]), log_level,
                                      uprobe_multi=program_type == UPROBE_MULTI)
            loaded._autoload(log_level)
        except BaseException:
            loaded.cleanup()
            raise
        return loaded

    def _create_maps(self) -> None:
        for spec in self.compiled.maps:
            fd = self._lib.bcc_create_map(spec.type, spec.name.encode(), spec.key_size, spec.value_size,
                                          spec.max_entries, spec.flags)
            if fd < 0:
                code = ct.get_errno()
                kind = BPFPermissionError if code == errno.EPERM else BPFLoadError
                raise kind(f"the kernel refused to create map {spec.name}: {os.strerror(code)}")
            self._map_fds[spec.name] = fd

    def _load_function(self, function: FunctionSpec, program_type: int, log_level: int, uprobe_multi: bool = False) -> int:
        descriptors = {index: self._map_fds[self.compiled.maps[map_index].name] for index, map_index in function.map_references}
        instructions = with_immediates(function.instructions, descriptors)
        if uprobe_multi:
            fd, printed = uprobes.load_program(instructions, self.compiled.license, self.compiled.kern_version, function.name, log_level)
            code = -fd if fd < 0 else 0
            self.log += printed
        else:
            with capture_stderr_fd() as out:  # (BCC's loader prints the verifier's log to fd 2)
                fd = self._lib.bcc_prog_load(program_type, function.name.encode(), instructions, len(instructions),
                                             self.compiled.license.encode(), self.compiled.kern_version, log_level, None, 0)
                code = ct.get_errno()
            self.log += "".join(out)
        if fd < 0:
            if code == errno.EPERM and "invalid" not in self.log.lower():
                raise BPFPermissionError(f"the kernel refused to load BPF: {os.strerror(code)}", self.log)
            raise BPFLoadError(f"the kernel verifier rejected {function.name}: {os.strerror(code)}\n{tail(self.log)}", self.log)
        self._program_fds[function.name] = fd
        return fd

    def _autoload(self, log_level: int) -> None:
        for function in self.compiled.functions:
            if function.name.startswith(RAW_TRACEPOINT_PREFIX):
                fd = self._load_function(function, PROGRAM_TYPES["RAW_TRACEPOINT"], log_level)
                try:
                    self._attach_raw_tracepoint(fd, function.name[len(RAW_TRACEPOINT_PREFIX):].encode())
                except OSError as error:
                    raise BPFAttachError(f"could not attach {function.name}: {error.strerror}") from error
            elif function.name.startswith(_OTHER_AUTOLOAD_PREFIXES):
                raise BPFLoadError(f"{function.name}: BCC would attach it by its name, which this loader does not do")

    # -- what the sampler uses ---------------------------------------------------------------

    def __getitem__(self, name: bytes | str) -> BpfMap:
        name = name.decode() if isinstance(name, bytes) else name
        if name not in self._maps:
            spec = next((spec for spec in self.compiled.maps if spec.name == name), None)
            if spec is None:
                raise KeyError(f"the program has no map {name!r}")
            self._maps[name] = map_over(spec, self._map_fds[name], self._readers)
        return self._maps[name]

    def function_fd(self, name: bytes | str) -> int:
        return self._program_fds[name.decode() if isinstance(name, bytes) else name]

    def attach_perf_event(self, function: bytes, ev_type: int, ev_config: int, sample_freq: int) -> None:
        """``function`` on every online CPU's perf event (type, config) at ``sample_freq`` Hz;
        OSError with the kernel's errno when one CPU's cannot be opened."""
        program_fd = self.function_fd(function)
        for cpu in bcc_bpf.cpus("online"):
            fd = self._lib.bpf_attach_perf_event(program_fd, ev_type, ev_config, 0, sample_freq, -1, cpu, -1)
            if fd < 0:
                code = ct.get_errno()
                raise OSError(code, f"perf event on CPU {cpu}: {os.strerror(code)}")
            self._perf_event_fds.append(fd)

    def attach_raw_tracepoint(self, tracepoint: bytes, function: bytes) -> None:
        self._attach_raw_tracepoint(self.function_fd(function), tracepoint)

    def _attach_raw_tracepoint(self, program_fd: int, tracepoint: bytes) -> None:
        fd = self._lib.bpf_attach_raw_tracepoint(program_fd, tracepoint)
        if fd < 0:
            code = ct.get_errno()
            raise OSError(code, f"raw tracepoint {tracepoint.decode()}: {os.strerror(code)}")
        self._tracepoint_fds.append(fd)

    def perf_buffer_poll(self, timeout: int = -1) -> None:
        """Read every perf buffer that has data (waiting up to ``timeout`` ms), calling its callbacks."""
        readers = (ct.c_void_p * len(self._readers))(*self._readers.values())
        self._lib.perf_reader_poll(len(readers), readers, timeout)

    def perf_buffer_consume(self) -> None:
        """Read every perf buffer, whether or not a poll would say it has data (a poll of the
        readers' descriptors consumes the wake-up it reports: after one, only this reads)."""
        readers = (ct.c_void_p * len(self._readers))(*self._readers.values())
        self._lib.perf_reader_consume(len(readers), readers)

    def perf_reader_fds(self) -> list[int]:
        """The file descriptors of the perf buffers' readers: each polls readable once its buffer
        has data (to wait for them beside a descriptor of one's own)."""
        return [self._lib.perf_reader_fd(reader) for reader in self._readers.values()]

    def cleanup(self) -> None:
        for fd in self._perf_event_fds:
            self._lib.bpf_close_perf_event_fd(fd)
        for fd in self._tracepoint_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for reader in self._readers.values():
            self._lib.perf_reader_free(reader)
        for fd in [*self._program_fds.values(), *self._map_fds.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._readers.clear()  # (the perf maps hold this dict)
        self._perf_event_fds, self._tracepoint_fds = [], []
        self._program_fds, self._map_fds, self._maps = {}, {}, {}
