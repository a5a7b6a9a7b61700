"""A walked user stack's Python frames, and where they go among its native frames.

The kernel appends the Python frames it read (innermost first) after the native ones, each a
tagged value of CPython's kinds (bpf/profile.h, PYTHON_FRAME_*): the code object's address, the
instruction, and whether it is the outermost frame of one call of the eval loop. (Other
runtimes' frames, a JVM's in a process that loaded libpython, carry kinds of their own.) Each call of the eval loop is one
native frame (``_PyEval_EvalFrameDefault``; 2.7: ``PyEval_EvalFrameEx``) running a run of Python
frames: before 3.11 exactly one, since 3.11 every Python-to-Python call a run of several. So the
stack reads true when each eval loop frame, from the leaf, is replaced by the next run:
``<module> → main → run_once → spin_heavy → PyLong_Multiply → (kernel)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

TAG = 1 << 63  # (symbols/runtime_stacks.py: every runtime's frame has it, its kind in bits 60-62)
KINDS = frozenset({0, 7})  # 7: the outermost frame of one call of the eval loop
LAST_OF_CALL = 7 << 60
INSTRUCTION_SHIFT = 47
INSTRUCTION_MASK = 0x1FFF
ADDRESS_MASK = ((1 << 47) - 1) & ~7  # code objects are 8-byte aligned
FIRST_LINE_MASK = 7  # the low bits of co_firstlineno, as the kernel read it at the sample

# The native function that is one call of the eval loop: its name's start (LTO and hot/cold
# splitting add suffixes: "_PyEval_EvalFrameDefault.cold").
EVAL_LOOP = "_PyEval_EvalFrameDefault"
EVAL_LOOP_2 = "PyEval_EvalFrameEx"  # 2.7's loop (in 3.x a wrapper that calls the one above)


@dataclasses.dataclass(frozen=True, slots=True)
class PythonFrame:
    code: int  # the code object's address in the process
    instruction: int  # f_lasti as the interpreter keeps it before 3.11, else the code unit's index
    last_of_call: bool
    first_line_bits: int = 0  # co_firstlineno & FIRST_LINE_MASK at the sample


def is_python(value: int) -> bool:
    return bool(value & TAG) and (value >> 60) & 7 in KINDS


def split(addresses: Sequence[int]) -> tuple[list[int], list[PythonFrame]]:
    """(the other values: native addresses and other runtimes' frames; Python frames), each
    innermost first."""
    native: list[int] = []
    python: list[PythonFrame] = []
    for value in addresses:
        if is_python(value):
            python.append(PythonFrame(value & ADDRESS_MASK, (value >> INSTRUCTION_SHIFT) & INSTRUCTION_MASK, bool(value & LAST_OF_CALL),
                                      value & FIRST_LINE_MASK))
        else:
            native.append(value)
    return native, python


def calls(frames: Sequence[PythonFrame]) -> list[list[PythonFrame]]:
    """The frames in runs, one per call of the eval loop, innermost first. The last run may lack
    its mark (the kernel stopped reading frames): it is still one."""
    runs: list[list[PythonFrame]] = []
    current: list[PythonFrame] = []
    for frame in frames:
        current.append(frame)
        if frame.last_of_call:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def eval_loop_test(major: int) -> Callable[[str | None], bool]:
    """Whether a native frame's function name is a call of the eval loop, for CPython ``major``."""
    prefix = EVAL_LOOP_2 if major == 2 else EVAL_LOOP
    return lambda name: bool(name) and (name == prefix or name.startswith(prefix + "."))


N = TypeVar("N")
P = TypeVar("P")


def interleave(native: Sequence[N], runs: Sequence[Sequence[P]], is_eval_loop: Callable[[N], bool]) -> list[N | P]:
    """``native`` (innermost first) with each eval loop frame replaced by the next run of Python
    frames. Runs left over when the native frames end (their walk stopped short) go at the
    outer end, where they belong; eval loop frames left over (the kernel read fewer Python
    frames) stay as they are."""
    out: list[N | P] = []
    next_run = 0
    for frame in native:
        if next_run < len(runs) and is_eval_loop(frame):
            out.extend(runs[next_run])
            next_run += 1
        else:
            out.append(frame)
    for run in runs[next_run:]:
        out.extend(run)
    return out
