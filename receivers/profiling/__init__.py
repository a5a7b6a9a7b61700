"""The profiling receiver: continuous CPU profiling with eBPF (BCC).

Modules: `sampler` (the BPF program and its maps), `processes` (what /proc said about each
sampled process), `symbolizer` (addresses -> function names).  Nothing here imports `bcc` until
`Sampler.start()` runs.
"""
