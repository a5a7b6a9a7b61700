"""Where a memory sample's stack leaves the allocator (exporters/allocation_sites.py): pprof's
drop_frames rule, over the stacks our samplers' probes fire in."""

from __future__ import annotations

import pytest

from exporters.allocation_sites import allocator_depth, pprof_pattern, simplified

NATIVE = ["sample", "malloc_sampled", "malloc"]  # the native sampler's frames, leaf first


@pytest.mark.parametrize("stack, site", [
    (NATIVE + ["alloc_hot", "main"], "alloc_hot"),
    # C++: operator new calls malloc; the site is new's caller, whatever the demangler wrote.
    (NATIVE + ["operator new(unsigned long)", "Cache::grow()", "main"], "Cache::grow()"),
    (NATIVE + ["_Znam", "fill", "main"], "fill"),
    # Rust's global allocator, and CPython's domains above malloc.
    (NATIVE + ["__rdl_alloc", "__rust_alloc", "alloc::raw_vec::finish_grow", "main"], "alloc::raw_vec::finish_grow"),
    (NATIVE + ["_PyMem_RawMalloc", "PyMem_RawMalloc", "_PyObject_Malloc", "PyObject_Malloc", "PyBytes_FromStringAndSize", "_PyEval_EvalFrameDefault"],
     "PyBytes_FromStringAndSize"),
    # The sampler's inner frames without symbols (a stripped library): malloc is still named.
    (["[libpycollector_heap.so]+0x17ec", "[libpycollector_heap.so]+0x2144", "malloc", "work", "main"], "work"),
    # From the root: an allocator called by a hook inside an allocator is all the allocator's.
    (NATIVE + ["hook", "realloc", "grow", "main"], "grow"),
    # No entry point: the leaf. Nothing but the allocator: the leaf too (pprof keeps it all).
    (["custom_alloc", "work", "main"], "custom_alloc"),
    (NATIVE, "sample"),
])
def test_the_site_is_the_caller_of_the_outermost_allocator_entry(stack, site):
    assert stack[allocator_depth(stack)] == site


def test_names_are_matched_as_pprof_matches_them():
    assert simplified("operator new[](unsigned long)") == "operator new[]"
    assert simplified("(anonymous namespace)::Pool::get(int)") == "(anonymous namespace)::Pool::get"
    assert simplified("Visitor::operator()(Node&) const") == "Visitor::operator()"
    assert simplified(".malloc") == "malloc"  # PPC ELF v1's function descriptors
    assert allocator_depth(["free_list_pop", "malloc_trim_helper", "work"]) == 0  # whole names only


def test_a_drop_frames_python_cannot_read_is_named():
    with pytest.raises(ValueError, match=r"drop_frames '\(unclosed' is not a regular expression"):
        pprof_pattern("(unclosed")
    with pytest.raises(ValueError, match=r"keep_frames '\[' is not a regular expression"):
        pprof_pattern("malloc", "[")
    assert allocator_depth(["leaf", "drop_me", "main"], pprof_pattern("drop_me|other")) == 2
    # keep_frames spares what it names, as pprof's Prune does.
    assert allocator_depth(["leaf", "drop_me", "main"], pprof_pattern("drop_.*", "drop_me")) == 0
    assert allocator_depth(["leaf", "drop_it", "main"], pprof_pattern("drop_.*", "drop_me")) == 2
