"""A user stack in which the kernel recorded language runtimes' frames: a value with bit 63 set (no
user address has it) and its kind in bits 60-62, which says whose frame it is (bpf/profile.h:
CPython's 0 and 7, V8's 1-3, HotSpot's 4-6), for some kinds followed by a slot of the frame's own
(its pc or bytecode pointer). V8's and HotSpot's stand where they ran; CPython's are appended
after the walk. The native addresses are named by the symbolizer, each runtime's frames by the
runtime (``Runtime``) whose kind they carry: the runtimes of one process (a JVM that loaded
libpython) each name their own, and no list's order decides whose a frame is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .frame import Frame

TAG = 1 << 63
KIND_SHIFT = 60
POINTER_MASK = (1 << 47) - 1  # (where each runtime keeps the address its frame is named from)


def kind_of(value: int) -> int:
    return (value >> KIND_SHIFT) & 7


def split(addresses: Sequence[int], has_next: Callable[[int], bool]) -> tuple[list[tuple[int | None, int]], list[int]]:
    """Each frame as (the runtime's value, the slot after it or 0), or (None, 0) for a native
    frame; and the native addresses, in order. ``has_next(kind)``: whether that kind's value is
    followed by a slot of its own."""
    frames: list[tuple[int | None, int]] = []
    native: list[int] = []
    at = 0
    while at < len(addresses):
        value = addresses[at]
        at += 1
        if not value & TAG:
            frames.append((None, 0))
            native.append(value)
        elif has_next(kind_of(value)) and at < len(addresses) and not addresses[at] & TAG:
            frames.append((value, addresses[at]))
            at += 1
        else:
            frames.append((value, 0))
    return frames, native


@dataclass(frozen=True, slots=True)
class Recorded:
    """A runtime's frame as the kernel recorded it, not named yet: its tagged value, the slot
    after it (for a kind that has one, else 0) and its place among the stack's frames (0: the
    leaf; the runtimes whose frames are appended after the walk, CPython's, count none)."""

    value: int
    next_slot: int = 0
    index: int = 0

    @property
    def kind(self) -> int:
        return kind_of(self.value)


Stack = list  # of Frame (a native frame, named) and Recorded (a runtime's, for its runtime to name)


class Runtime(Protocol):
    """One language runtime, as the receiver and the report use it: CPython (python/), V8 (v8/)
    and HotSpot (hotspot/) implement it, and another (Ruby, PHP, .NET) is a folder that does.

    - detect per file: its ``files`` (symbols/detection.py), asked by ``register``, off the
      events thread;
    - attach per process: ``register(info)`` for each process the table tells of (new, exec'd,
      its maps read again), ``knows(tgid, started)`` whether it attached to tgid's process that
      started at tick ``started`` (the sample's: a pid reused since is another process, whose
      state names none of its predecessor's frames);
    - name frames: the kernel records its frames as values tagged with its ``kinds``
      (bpf/profile.h); ``name(tgid, stack, started)`` names those of a stack, and may name native frames
      of its own (HotSpot's stubs) or put its frames in their place (CPython's runs, where the
      eval loop's frames are). A runtime touches its kinds and its own native frames only, so the
      runtimes of one process each name theirs, in any order. ``has_next(kind)``: whether the
      kernel put a slot of the frame's own after it (a pc, a bytecode pointer); ``appended``:
      whether the kernel appends its frames after the walk rather than where they ran;
    - detach: ``forget(tgid)``; ``new_report(budget)`` once a report, before it names anything;
    - counters: ``stats``, on its own gauge."""

    kinds: frozenset[int]
    appended: bool
    stats: dict[str, int]

    def register(self, info: Any) -> None: ...

    def forget(self, tgid: int) -> None: ...

    def knows(self, tgid: int, started: int | None = None) -> bool: ...

    def new_report(self, budget: Any) -> None: ...

    def has_next(self, kind: int) -> bool: ...

    def name(self, tgid: int, stack: Stack, started: int | None = None) -> Stack: ...


def name_stack(tgid: int, addresses: Sequence[int], runtimes: Sequence[Runtime], symbolize: Callable[[list[int]], list[Frame]],
               started: int | None = None) -> list[Frame]:
    """Process ``tgid``'s user stack's frames, leaf first: its native addresses named by
    ``symbolize``, each runtime's frames by the runtime of ``runtimes`` (those attached to the
    process) whose kind they carry (one of a runtime not attached: a nameless native frame). The stack ends where the symbolizer ended it
    (where a Go stack starts); frames appended after the walk (CPython's) are kept."""
    by_kind = {kind: runtime for runtime in runtimes for kind in runtime.kinds}
    appended = {kind for runtime in runtimes if runtime.appended for kind in runtime.kinds}
    walked = [value for value in addresses if not (value & TAG and kind_of(value) in appended)]
    frames, native = split(walked, lambda kind: kind in by_kind and by_kind[kind].has_next(kind))
    # The symbolizer looks a return address up one byte back, every address but its first: when
    # the leaf is a runtime's, the first native address is a return address too.
    leaf_is_native = bool(frames) and frames[0][0] is None
    natives = iter(symbolize(native) if leaf_is_native else symbolize([0, *native])[1:])
    stack: Stack = []
    for index, (value, next_slot) in enumerate(frames):
        if value is None:
            frame = next(natives, None)
            if frame is None:
                break
            stack.append(frame)
        else:
            stack.append(Recorded(value, next_slot, index))
    stack += [Recorded(value) for value in addresses if value & TAG and kind_of(value) in appended]
    for runtime in runtimes:
        stack = runtime.name(tgid, stack, started)
    return [unnamed(item) for item in stack]


def name_recorded(stack: Stack, kinds: frozenset[int], name_one: Callable[[Recorded], list[Frame]],
                  native_frame: Callable[[Frame], Frame] = lambda frame: frame) -> Stack:
    """``stack`` with each of its Recorded frames of ``kinds`` replaced by ``name_one``'s frames
    and each native frame by ``native_frame``'s (a runtime's ``name``, for frames recorded where
    they ran)."""
    out: Stack = []
    for item in stack:
        if isinstance(item, Recorded):
            out.extend(name_one(item) if item.kind in kinds else (item,))
        else:
            out.append(native_frame(item))
    return out


def unnamed(item: Frame | Recorded) -> Frame:
    """A frame no runtime named: a Recorded one of a runtime not attached to the process."""
    return item if isinstance(item, Frame) else Frame(address=item.value & POINTER_MASK, kind="native")
