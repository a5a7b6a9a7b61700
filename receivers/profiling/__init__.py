"""The profiling receiver: continuous CPU profiling with eBPF (BCC).

README.md beside this file maps its rooms. Nothing here imports `bcc` until `Sampler.start()`
runs.
"""
