"""The kernel side: loading the BPF programs (program.py) with their settings (settings.py), the
sampler that flips and drains the count maps (sampler.py, count_maps.py, samples.py), the BPF
counters (counters.py), the running kernel's BTF offsets (btf.py) and probabilistic profiling's
on/off switch (probabilistic.py). Imports nothing else of the receiver; `bcc` only in
`Sampler.start()`.
"""
