"""How many worker processes a config runs in (``service::workers``).

``auto`` (the default) gives a gateway one worker per core it may use and an agent one: a config
runs in several workers only when every receiver in it can (``Factory.why_not_in_workers``), as the
otlp receiver can on a TCP port others share; a profiling receiver samples the host once.
A number asks for that many, and a receiver that cannot run in several is an error naming it.
"""

from __future__ import annotations

import math
import os

from pycollector.config.errors import ConfigError
from pycollector.config.validate import AUTO_WORKERS, Plan

CGROUP_ROOT = "/sys/fs/cgroup"


def usable_cpus(cgroup_root: str = CGROUP_ROOT, own_cgroup: str | None = None) -> int:
    """The cores this process may run on: its CPU affinity, capped by the CPU quota of its cgroup
    and of every cgroup above it (a pod limited to 2 CPUs on a 64-core node has 2; so has a unit
    with CPUQuota=200%), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    directory = os.path.join(cgroup_root, (own_cgroup if own_cgroup is not None else _own_cgroup()).strip("/"))
    while True:
        quota = _quota(os.path.join(directory, "cpu.max"))
        if quota is not None:
            cpus = min(cpus, quota)
        if os.path.normpath(directory) == os.path.normpath(cgroup_root):
            return max(1, cpus)
        directory = os.path.dirname(directory)


def _own_cgroup() -> str:
    """This process's cgroup v2 path ("/system.slice/x.service"; "/" inside a container's
    cgroup namespace)."""
    try:
        with open("/proc/self/cgroup") as file:
            for line in file:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


def _quota(cpu_max: str) -> int | None:
    """Whole CPUs a cpu.max file allows (rounded up), None for no quota (or no file)."""
    try:
        with open(cpu_max) as file:
            quota, period = file.read().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def why_not_in_workers(plan: Plan) -> list[str]:
    """'receivers::<id>: <reason>' for every receiver that cannot run in several workers."""
    reasons = []
    for (kind, component_id), spec in plan.components.items():
        if kind != "receivers" or not _in_a_pipeline(plan, component_id):
            continue
        reason = spec.factory.why_not_in_workers(spec.config)
        if reason is not None:
            reasons.append(f"{spec.path}: {reason}")
    return reasons


def worker_count(plan: Plan, cpus: int | None = None) -> tuple[int, str]:
    """(how many workers, why that many, for the log). Raises ConfigError for a number the
    config's receivers cannot run in."""
    reasons = why_not_in_workers(plan)
    if plan.workers == AUTO_WORKERS:
        if reasons:
            return 1, "; ".join(reasons)
        cpus = usable_cpus() if cpus is None else cpus
        return cpus, f"one per usable core ({cpus})"
    if plan.workers > 1 and reasons:
        raise ConfigError([f"service::workers: {plan.workers} workers cannot each run {reason} (set service::workers: 1, or auto)"
                           for reason in reasons])
    return plan.workers, "service::workers"


def _in_a_pipeline(plan: Plan, receiver_id: str) -> bool:
    return any(receiver_id in pipeline.receivers for pipeline in plan.pipelines.values())
