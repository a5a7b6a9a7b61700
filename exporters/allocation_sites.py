"""Where a memory sample's stack leaves the allocator: its allocation site.

A sampled allocation's stack starts where the sampler's probe fired, inside the allocator (our
native sampler's ``sample``, under ``malloc_sampled``, under the ``malloc`` it wraps), and runs
out through an allocator entry point (``malloc``, ``operator new``, ``PyObject_Malloc``...) to the
code that asked for memory. People read a heap profile by that code, so the exporters that name
sites (the debug console, the flame graph page, ``pycollector diff``) leave the allocator's frames
out, and the pprof exporter writes the same rule into its heap files as ``drop_frames``, which
pprof tools apply on reading (as they do for the heap profiles of C++ programs: pprof's own list of
allocator functions is where these names come from).

The rule is pprof's (``Profile.Prune``), so that every reader agrees on the site: from the root
towards the leaf, the first frame matching ``ALLOCATOR_FRAMES`` that comes after one that does not
is the allocator's entry, and it and everything it called are dropped. A C++ name is matched
without its argument list, as pprof matches it (``operator new(unsigned long)`` is ``operator
new``). A stack with no entry point (a sampler of another allocator) keeps its leaf.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# The allocators' entry points, as one regular expression in the syntax both Python and Go's RE2
# read (pprof anchors it: ^(...)$).
ALLOCATOR_FRAMES = "|".join((
    # libc's malloc family, which the native sampler wraps, and glibc's own names for them
    r"(__libc_)?(malloc|calloc|realloc|reallocarray|free|cfree|memalign|posix_memalign|aligned_alloc|valloc|pvalloc)",
    # C++'s operator new, demangled (its arguments cut) or not
    r"operator new(\[\])?", r"_Zn[wa]m.*",
    # Rust's global allocator
    r"__(rust|rdl|rg)_(alloc|alloc_zeroed|realloc)",
    # CPython's allocator domains, which its objects are allocated through
    r"_?Py(Mem|Object)_(Raw)?(Malloc|Calloc|Realloc)", r"_?PyObject_GC_(Malloc|Calloc|New|NewVar)",
))
_ALLOCATOR = re.compile(f"^({ALLOCATOR_FRAMES})$")
# pprof cuts a name at its first "(" but for these two, which hold one.
ANONYMOUS_NAMESPACE, CALL_OPERATOR = "(anonymous namespace)", "operator()"


def pprof_pattern(drop_frames: str, keep_frames: str = "") -> re.Pattern:
    """A pprof file's ``drop_frames`` (less its ``keep_frames``) as pprof compiles them (each
    anchored); ValueError naming the field if Python cannot read one."""
    for field, pattern in (("drop_frames", drop_frames), ("keep_frames", keep_frames)):
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{field} {pattern!r} is not a regular expression: {error}") from error
    return re.compile(f"(?!(?:{keep_frames})$)(?:{drop_frames})$" if keep_frames else f"(?:{drop_frames})$")


def simplified(name: str) -> str:
    """The name pprof matches ``drop_frames`` against: without a leading "." (PPC's ELF v1) and
    without its argument list."""
    name = name.removeprefix(".")
    position = 0
    while (at := name.find("(", position)) >= 0:
        if not (name.startswith(ANONYMOUS_NAMESPACE, at) or name.startswith(CALL_OPERATOR, at - CALL_OPERATOR.index("("))):
            return name[:at]
        position = at + 1
    return name


def allocator_depth(names: Sequence[str], pattern: re.Pattern = _ALLOCATOR) -> int:
    """How many of a stack's frames, named leaf first, are the allocator's: the leaf side of the
    first frame from the root matching ``pattern`` after one that does not, itself included; 0
    when there is none. ``names[allocator_depth(names)]`` is the allocation site. A frame without
    a name is never the allocator's."""
    after_code = False
    for index in range(len(names) - 1, -1, -1):
        if names[index] and pattern.match(simplified(names[index])):
            if after_code:
                return index + 1
        else:
            after_code = True
    return 0
