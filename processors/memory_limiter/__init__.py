"""The memory limiter: refuses data (backpressure) while the process holds too much memory.

Modules: `config` (keys as Go's), `memory` (resident size, cgroup/total limits, giving memory
back), `limiter` (the check thread and the refusing processor).
"""
