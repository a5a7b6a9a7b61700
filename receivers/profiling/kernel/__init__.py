"""The kernel side: getting the BPF program in (program.py: the compiled program from the cache,
program_cache.py, or compiled by a child process, compiler.py, into the form compiled.py and
ctypes_layout.py describe; then loaded without BCC's compiler, loader.py, with the maps user space
reads, maps.py, through BCC's libbcc_bpf, bcc_bpf.py) with its settings (settings.py), the sampler
that flips and drains the count maps (sampler.py, count_maps.py, samples.py), the BPF counters
(counters.py), the running kernel's BTF offsets (btf.py) and probabilistic profiling's on/off
switch (probabilistic.py). Imports nothing else of the receiver; `bcc` only in the compiler child.
"""
