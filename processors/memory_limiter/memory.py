"""How much memory this process holds, how much it may hold, and giving freed memory back.

The Go limiter reads its runtime's heap statistics. A Python process has no such number that
includes what C extensions (protobuf, grpc) allocate, so we measure the resident set size: what
the kernel's OOM killer and a container's memory limit count too.
"""

from __future__ import annotations

import gc
from pathlib import Path

from pycollector.process_memory import resident_bytes, trim_heap  # noqa: F401  (the limiter reads both from here)

# What cgroup v1 reports as the limit when none is set (the largest page-aligned int64).
CGROUP_V1_UNLIMITED = 9223372036854771712


def available_bytes(
    cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self", meminfo: str = "/proc/meminfo"
) -> int:
    """This process's cgroup memory limit when it has one, else the machine's total memory."""
    limit = cgroup_limit_bytes(cgroup_root, proc_self)
    return limit if limit is not None else total_memory_bytes(meminfo)


def cgroup_limit_bytes(
    cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self"
) -> int | None:
    """The memory limit of this process's cgroup: v2, then v2 in the hybrid layout's ``unified``
    mount, then v1. None when the first of those that exists says there is no limit."""
    own = _own_cgroups(Path(proc_self) / "cgroup")
    root = Path(cgroup_root)
    candidates = []
    for v2_root in (root, root / "unified"):
        if "" in own:
            candidates.append(v2_root / own[""].lstrip("/") / "memory.max")
        candidates.append(v2_root / "memory.max")
    if "memory" in own:
        candidates.append(root / "memory" / own["memory"].lstrip("/") / "memory.limit_in_bytes")
    candidates.append(root / "memory" / "memory.limit_in_bytes")
    for path in candidates:
        try:
            text = path.read_text().strip()
        except OSError:
            continue  # not this layout; a container often sees only its own cgroup as the root
        if text == "max":
            return None
        limit = int(text)
        return None if limit >= CGROUP_V1_UNLIMITED else limit
    return None


def _own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> cgroup path, from lines ``id:controllers:path``; "" is the v2 hierarchy."""
    own: dict[str, str] = {}
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def total_memory_bytes(meminfo: str = "/proc/meminfo") -> int:
    with open(meminfo) as stream:
        for line in stream:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{meminfo} has no MemTotal line")


def collect_garbage() -> None:
    """Free unreachable cycles (reference counting frees the rest at once), then return the
    freed heap to the kernel."""
    gc.collect()
    trim_heap()
