"""The live heap at a report: the sampled allocations not freed yet (bpf/memory.bpf.c's
live_allocs), as in-use counts under their stacks (ORIGIN_INUSE_OBJECTS, ORIGIN_INUSE_SPACE).

Unlike the count maps, live_allocs is not drained: an allocation stays until its free, however
many reports that takes, and each report shows what is alive then. Its stacks are in live_stacks
under their hash, not double-buffered either; this module keeps a copy of each stack it read and
prunes the kernel's: a stack no allocation referred to at two reads in a row is deleted (a walk
that found it there just before the delete references a stack this module has read already, so
its allocation keeps its frames). A process detached (exit, exec) has its allocations deleted at
once (``forget``): they were its old image's.
"""

from __future__ import annotations

import collections
import contextlib
import threading

import structlog

from receivers.profiling.kernel.count_maps import map_int
from receivers.profiling.kernel.samples import ORIGIN_INUSE_OBJECTS, ORIGIN_INUSE_SPACE, StackCount, stack_count

STACK_HASHED = -61  # profile.h: the user stack is stored by its hash


class LiveHeap:
    def __init__(self, maps, logger=None) -> None:
        self.allocs = maps.live_allocs
        self.stacks = maps.live_stacks
        self.counts = maps.live_counts
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.memory")
        self._lock = threading.Lock()  # (read on the report thread, forget on the attaching one)
        self._frames: dict[int, list[int]] = {}  # stack hash -> frames, as read from live_stacks
        self._unreferenced: set[int] = set()  # hashes no allocation referred to at the last read
        self._pruned: set[int] = set()  # hashes deleted from live_stacks at the last read
        self.stats = dict.fromkeys(("allocations", "bytes", "stacks_missing", "stacks_pruned", "forgotten"), 0)

    def forget(self, tgid: int) -> None:
        """Delete the allocations of ``tgid``: its probes are detached (an exit, an exec)."""
        with self._lock:
            for key, _ in self._entries():
                if key.tgid == tgid:
                    with contextlib.suppress(KeyError):
                        del self.allocs[key]
                    self.stats["forgotten"] += 1
            with contextlib.suppress(KeyError):  # (its share: the next process under the pid starts at 0)
                del self.counts[self.counts.Key(tgid)]

    def read(self) -> list[StackCount]:
        """Two StackCounts for each (thread, stack) of the live heap: how many allocations and how
        many bytes their weights stand for."""
        with self._lock:
            groups: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
            for key, live in self._entries():
                group = groups[(key.tgid, live.pid, bytes(live.comm).split(b"\0", 1)[0], live.process_start, live.user_stack_hash,
                                live.user_leaf_return)]
                group[0] += 1
                group[1] += live.weight
            referenced = {group[4] for group in groups if group[4]}
            self._read_stacks(referenced)
            out = []
            allocations = size = 0
            for (tgid, tid, comm, started, stack_hash, leaf_return), (count, weight) in groups.items():
                frames = self._frames.get(stack_hash) if stack_hash else None
                if stack_hash and frames is None:
                    self.stats["stacks_missing"] += 1
                user_error = 0 if frames is not None else STACK_HASHED
                for origin, value in ((ORIGIN_INUSE_OBJECTS, count), (ORIGIN_INUSE_SPACE, weight)):
                    out.append(stack_count(tgid, tid, comm, (), frames or (), leaf_return, value, 0, user_error, origin, b"", started))
                allocations += count
                size += weight
            self.stats["allocations"], self.stats["bytes"] = allocations, size
            return out

    def _entries(self) -> list:
        try:
            return list(self.allocs.items_lookup_batch())
        except Exception:  # noqa: BLE001 - a kernel without batch lookups: one by one
            return self.allocs.items()

    def _read_stacks(self, referenced: set[int]) -> None:
        """Copy the referenced stacks not read yet, and prune those unreferenced twice in a row
        (their copies go a read later: a walk may have referred to one just before the delete)."""
        for stack_hash in self._pruned - referenced:
            self._frames.pop(stack_hash, None)
        unreferenced, pruned = set(), set()
        for key in list(self.stacks.keys()):
            stack_hash = map_int(key)
            if stack_hash in referenced:
                if stack_hash not in self._frames:
                    with contextlib.suppress(KeyError):
                        stack = self.stacks[key]
                        self._frames[stack_hash] = list(stack.ips[: min(stack.len, len(stack.ips))])
            elif stack_hash in self._unreferenced:
                with contextlib.suppress(KeyError):
                    del self.stacks[key]
                pruned.add(stack_hash)
                self.stats["stacks_pruned"] += 1
            else:
                unreferenced.add(stack_hash)
        self._unreferenced, self._pruned = unreferenced, pruned
