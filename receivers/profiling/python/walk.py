"""The kernel walker's steps done in Python, through /proc/PID/mem: a reference for the BPF
walker (what it must find, checked against the interpreter's own sys._current_frames() in
tests/test_cpython_walk.py) and a way to look at a process's Python stacks by hand.

Threads: the pointer at the interpreters' head (CPython.interpreters_head + load bias) leads to
each PyInterpreterState, whose list of PyThreadStates carries each thread's pthread_self()
(thread_id) and, from 3.11, its tid. Frames: the thread's innermost frame (through _PyCFrame in
3.11 and 3.12), then previous / f_back. From 3.12 a shim frame owned by the C stack sits below
each call of the eval loop (and in 3.14 a base frame owned by the interpreter below them all):
neither runs code, both are skipped, and the frame above a shim is the first its call ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..processes.memory import ProcessMemory
from .offsets import EntryKind, Offsets


@dataclass(frozen=True, slots=True)
class ThreadState:
    address: int
    thread_id: int  # pthread_self(): x86-64 glibc's fsbase of the thread
    native_id: int | None  # the tid (3.11+)


@dataclass(frozen=True, slots=True)
class WalkedFrame:
    code: int  # the code object's address
    instruction: int  # as the walker records it (offsets.instruction_kind)
    first_of_call: bool  # the first frame one call of the eval loop ran (its outermost)


def thread_states(memory: ProcessMemory, offsets: Offsets, head_pointer: int, limit: int = 4096) -> list[ThreadState]:
    """Every thread state of every interpreter; ``head_pointer`` is the process's address of
    the pointer to the first PyInterpreterState."""
    out: list[ThreadState] = []
    interpreter = memory.u64(head_pointer)
    while interpreter and len(out) < limit:
        state = memory.u64(interpreter + offsets.interpreter_threads_head)
        while state and len(out) < limit:
            native = memory.u64(state + offsets.thread_native_id) if offsets.thread_native_id is not None else None
            out.append(ThreadState(state, memory.u64(state + offsets.thread_id), native))
            state = memory.u64(state + offsets.thread_next)
        interpreter = memory.u64(interpreter + offsets.interpreter_next)
    return out


def python_frames(memory: ProcessMemory, offsets: Offsets, thread_state: int, limit: int = 1024) -> list[WalkedFrame]:
    """The thread's Python frames, innermost first."""
    frame = memory.u64(thread_state + offsets.thread_frame)
    if frame and offsets.cframe_current_frame is not None:
        frame = memory.u64(frame + offsets.cframe_current_frame)
    out: list[WalkedFrame] = []
    skipped_owners = {offsets.frame_owner_c_stack, offsets.frame_owner_interpreter} - {None}
    while frame and len(out) < limit:
        code = memory.u64(frame + offsets.frame_code) & ~offsets.frame_code_tag_mask
        previous = memory.u64(frame + offsets.frame_previous)
        if not offsets.interpreter_frames:
            # Each PyFrameObject is run by a call of its own.
            out.append(WalkedFrame(code, max(0, memory.i32(frame + offsets.frame_instruction)), True))
            frame = previous
            continue
        owner = memory.read(frame + offsets.frame_owner, 1)[0]
        if offsets.entry_kind is EntryKind.OWNER and owner in skipped_owners:
            if out:  # a shim: the frame above it was the first of its call
                out[-1] = WalkedFrame(out[-1].code, out[-1].instruction, True)
            frame = previous
            continue
        pointer = memory.u64(frame + offsets.frame_instruction)
        instruction = max(0, (pointer - code - offsets.code_instructions) // 2)
        first = offsets.entry_kind is EntryKind.IS_ENTRY and owner != 0
        out.append(WalkedFrame(code, instruction, first or not previous))
        frame = previous
    return out
