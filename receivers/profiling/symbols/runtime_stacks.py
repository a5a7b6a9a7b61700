"""A user stack in which the kernel recorded a language runtime's frames (V8's, HotSpot's) in place
of their pcs: a value with bit 63 set (no user address has it), the kind in bits 60-62, and for
some kinds the slot after it holding the frame's pc or bytecode pointer (bpf/profile.h). The
native addresses between them are named by the symbolizer, the runtime's frames by the runtime."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .frame import Frame

TAG = 1 << 63
KIND_SHIFT = 60


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


def interleave(addresses: Sequence[int], has_next: Callable[[int], bool], symbolize: Callable[[list[int]], list[Frame]],
               runtime_frames: Callable[[int, int, int], list[Frame]], native_frame: Callable[[Frame], Frame] = lambda frame: frame) -> list[Frame]:
    """The stack's frames, leaf first: ``runtime_frames(index, value, next slot)`` for each frame
    of the runtime (index: its place among the stack's frames, 0 the leaf), ``native_frame`` of
    what ``symbolize`` made of each native address. The stack ends where the symbolizer ended it
    (where a Go stack starts)."""
    frames, native = split(addresses, has_next)
    # The symbolizer looks a return address up one byte back, every address but its first: when
    # the leaf is the runtime's, the first native address is a return address too.
    leaf_is_native = bool(frames) and frames[0][0] is None
    natives = iter(symbolize(native) if leaf_is_native else symbolize([0, *native])[1:])
    out: list[Frame] = []
    for index, (value, next_slot) in enumerate(frames):
        if value is None:
            frame = next(natives, None)
            if frame is None:
                break
            out.append(native_frame(frame))
        else:
            out.extend(runtime_frames(index, value, next_slot))
    return out
