"""Compiling the profiler's BPF program, in a child process whose memory goes back when it exits.

BCC's compile (clang and LLVM in libbcc) costs 1.5 s of CPU and 100 MiB of peak memory, which
the agent would otherwise hold for the rest of its life (glibc keeps the freed heap). The parent
runs ``compile_in_child``: this module as a script reads {source, cflags} on stdin, compiles with
BCC, and writes the CompiledProgram (compiled.py) on stdout, or the failure as
{kind, message, log}. The parent turns a failure back into the SamplerError the in-process
compile raised.
"""

from __future__ import annotations

import ctypes as ct
import json
import os
import subprocess
import sys
from pathlib import Path

from receivers.profiling.kernel import compiled as compiled_program, ctypes_layout
from receivers.profiling.kernel.program import (BPFCompileError, BPFPermissionError, KernelHeadersMissingError,
                                                SamplerError, capture_stderr_fd, kernel_headers_hint,
                                                tail)

_PERF_EVENT_ARRAY = 4
_FAILURES = {"headers": KernelHeadersMissingError, "permission": BPFPermissionError, "compile": BPFCompileError,
             "setup": SamplerError}
# Where ``receivers`` is imported from: the child imports the same code as its parent.
_IMPORT_ROOT = str(Path(__file__).resolve().parents[3])
CHILD_TIMEOUT_S = 600.0


def compile_in_child(source: Path, text: str, cflags: list[str]) -> tuple[compiled_program.CompiledProgram, str]:
    """``text`` (the program ``source`` holds, as the cache key saw it) compiled with ``cflags`` by
    a child process: the program, and what clang printed. Raises the SamplerError subclass the
    failure calls for."""
    request = json.dumps({"source": str(source), "text": text, "cflags": cflags})
    # Isolated (-I): the child runs as root, so it imports nothing from the current directory or
    # from PYTHON* variables; it sees the interpreter's site-packages and this package's root.
    command = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {_IMPORT_ROOT!r}); "
               "from receivers.profiling.kernel.compiler import main; main()"]
    try:
        done = subprocess.run(command, input=request.encode(), capture_output=True, timeout=CHILD_TIMEOUT_S, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BPFCompileError(f"the BPF compiler process did not finish: {error}") from error
    try:
        answer = json.loads(done.stdout)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError:
        stderr = done.stderr.decode("utf-8", "replace")
        raise BPFCompileError(f"the BPF compiler process ended with status {done.returncode} and no answer:\n"
                              f"{tail(stderr)}", stderr) from None
    if "error" in answer:
        raise _FAILURES.get(answer["error"], SamplerError)(answer.get("message", "?"), answer.get("log", ""))
    try:
        return compiled_program.CompiledProgram.from_json(json.dumps(answer["program"]).encode()), answer.get("log", "")
    except (KeyError, compiled_program.ProgramFormatError) as error:
        raise BPFCompileError(f"the BPF compiler process answered something unreadable: {error}") from error


def main() -> None:
    # The answer goes to the parent's pipe alone: whatever else writes to fd 1 (clang, libbcc)
    # goes to fd 2 with the rest of the compiler's output.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    try:
        program, log = compile_here(Path(request["source"]), request["text"], list(request["cflags"]))
    except SamplerError as error:
        kind = next((name for name, kind in _FAILURES.items() if type(error) is kind), "setup")
        answer = {"error": kind, "message": str(error), "log": error.log}
    except Exception as error:  # (anything else: the parent reports it as a failed compile)
        answer = {"error": "compile", "message": f"the BPF compiler process failed: {type(error).__name__}: {error}", "log": ""}
    else:
        answer = {"program": json.loads(program.to_json()), "log": log}
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer))


def compile_here(source: Path, text: str, cflags: list[str]) -> tuple[compiled_program.CompiledProgram, str]:
    """Compile with BCC in this process: the program with its map references taken out."""
    try:
        import bcc
    except ImportError as error:
        raise SamplerError("the `bcc` Python module is missing: install BCC's Python bindings "
                           "(Debian/Ubuntu: `apt-get install python3-bpfcc`; the virtualenv must see system "
                           f"site-packages) ({error})") from error
    with capture_stderr_fd() as out:
        try:
            bpf = bcc.BPF(text=text.encode(), cflags=cflags)
        except Exception as error:  # BCC raises bare Exception
            failure = error
        else:
            failure = None
    log = "".join(out)
    if failure is not None:
        if "kernel headers" in log.lower() or "linux/kconfig.h" in log:
            raise KernelHeadersMissingError(kernel_headers_hint(), log) from failure
        if "super-user" in str(failure) or "Operation not permitted" in log:
            raise BPFPermissionError(f"loading BPF was refused: {failure}", log)
        raise BPFCompileError(f"BCC could not compile {source}: {failure}\n{tail(log)}", log) from failure
    try:
        return _extract(bpf), log
    finally:
        bpf.cleanup()


def _extract(bpf) -> compiled_program.CompiledProgram:
    import bcc
    from bcc import table as bcc_table
    from bcc.libbcc import lib

    module = bpf.module
    table_name, table_count = _declared(lib, "bpf_table_name", ct.c_char_p), _declared(lib, "bpf_num_tables", ct.c_size_t)
    function_count = _declared(lib, "bpf_num_functions", ct.c_size_t)
    key_size, leaf_size = _declared(lib, "bpf_table_key_size_id", ct.c_size_t), _declared(lib, "bpf_table_leaf_size_id", ct.c_size_t)
    maps, index_of_fd = [], {}
    for map_id in range(table_count(module)):
        name = table_name(module, map_id)
        event = None
        map_type = lib.bpf_table_type_id(module, map_id)
        if map_type == _PERF_EVENT_ARRAY and lib.bpf_perf_event_fields(module, name) > 0:
            try:
                event = ctypes_layout.describe(bcc_table._get_event_class(bpf.get_table(name)))
            except SystemExit:  # (BCC exits on a field type it cannot map)
                raise BPFCompileError(f"BCC cannot describe the events of {name.decode()} in ctypes") from None
        # (From BCC's descriptions, as BPF.get_table decodes them, without building its table classes.)
        key_type = bcc.BPF._decode_table_type(json.loads(lib.bpf_table_key_desc(module, name)))
        value_type = bcc.BPF._decode_table_type(json.loads(lib.bpf_table_leaf_desc(module, name)))
        index_of_fd[lib.bpf_table_fd(module, name)] = len(maps)
        maps.append(compiled_program.MapSpec(
            name.decode(), map_type, key_size(module, map_id), leaf_size(module, map_id),
            lib.bpf_table_max_entries_id(module, map_id), lib.bpf_table_flags_id(module, map_id),
            ctypes_layout.describe(key_type), ctypes_layout.describe(value_type), event))
    functions = []
    for function_id in range(function_count(module)):
        name = lib.bpf_function_name(module, function_id)
        instructions = ct.string_at(lib.bpf_function_start(module, name), lib.bpf_function_size(module, name))
        found = compiled_program.references(instructions)
        unknown = [fd for _, fd in found if fd not in index_of_fd]
        if unknown:
            raise BPFCompileError(f"{name.decode()} refers to map descriptors {unknown} that no map of the program has")
        functions.append(compiled_program.FunctionSpec(
            name.decode(), compiled_program.with_immediates(instructions, {index: 0 for index, _ in found}),
            tuple((index, index_of_fd[fd]) for index, fd in found)))
    return compiled_program.CompiledProgram(lib.bpf_module_license(module).decode(), lib.bpf_module_kern_version(module),
                                            tuple(maps), tuple(functions))


def _declared(lib, name: str, restype):
    """A libbcc function BCC's module does not declare, on a handle of our own (BCC's is left as it is)."""
    function = getattr(ct.CDLL(lib._name), name)
    function.restype = restype
    function.argtypes = [ct.c_void_p] if name.startswith("bpf_num") else [ct.c_void_p, ct.c_size_t]
    return function


if __name__ == "__main__":
    main()
