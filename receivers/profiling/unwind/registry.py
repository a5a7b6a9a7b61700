"""Keeps the unwinder's kernel tables in step with the processes being sampled.

For each registered process, its executable mappings go to ``unwind_processes`` (sorted, with the
load bias that turns a pc into an address in the file and the id of the file's rows); each mapped
file's rows go once into ``unwind_rows``, its (first row, count) into ``unwind_files``. Rows are
built (or read from the disk cache) on a worker thread: until a file's rows are in, its mappings
carry file id 0 and the kernel steps through them by frame pointer; when they arrive, every
process that maps the file is written again. A file no registered process maps any more gives its
rows back.

Threading: ``register`` and ``forget`` are called from the sampler's and the report's threads and
return at once. Two workers build: one takes any file, the most wanted first; the other only small
ones, so a library dlopen()ed while libpython's rows are being built waits milliseconds, not the
half second that takes; it has a helper process of its own for CFI too large to build here
(RowSource), and leaves a file with more CFI than that helper takes to the other. One lock
guards the bookkeeping.

The row budget is shared (a process maps what it likes, hundreds of MB of libraries if it wants):
- while a quarter of the budget is free, every mapped file is loaded, the most wanted first; below
  that, only files whose code a walk needed (the kernel counts those frames in unwind_demand);
- a file mapped only by processes that hold more than their share of the budget (the budget
  divided among the registered processes that used a CPU in the last report) waits behind the
  files of the others;
- a file that finds no room takes the rows of files no walk used for ``idle_s`` (the kernel marks
  each file it uses in unwind_used; `sweep` reads and resets the marks every SWEEP_INTERVAL_S, and
  so does every search for room, before it judges),
  least recently used first; then those of files only processes found gone map (a report before
  they are removed and their rows freed);
- then, if a process that maps it holds less than its share, the rows of files that only
  processes over their share map, least recently used first: a process busy in more libraries
  than the budget holds keeps what its share holds, not everyone else's (a file's rows count
  for each process that maps it by an equal part, so libc is no one's excess);
- a file that still finds no room waits (``no_room``), and so does an evicted one, each queued
  again once a walk needed its code and there is room (the worker that takes any file looks
  every DEMAND_POLL_S while files wait, and every sweep does).
``stats`` tells it all: row_budget_exhausted, files_waiting_for_room, files_evicted (of them
files_evicted_over_share), row_budget_free.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

from pycollector.logs import log_once
from pycollector.periodic import Periodic

from receivers.profiling.elf.bounded import PT_LOAD, BoundedElf, segment_headers
from receivers.profiling.elf.headers import ElfHeaders, debug_file_candidates
from receivers.profiling.processes.files import open_debug_file, open_host_file, open_mapped_file
from receivers.profiling.processes.proc import Mapping, ProcessInfo
from receivers.profiling.unwind.builder_process import MAX_BUILD_S, BuilderProcess, BuildTimeout, HelperDied
from receivers.profiling.unwind.cache import RowCache
from receivers.profiling.unwind.rows import ROW_SIZE, CfiInput, NoRows, cfi_of, rows_from
from receivers.profiling.unwind.space import RowSpace

# Files whose code mapping is at most this large are small: the small files' worker takes nothing
# else. (Where rows are built goes by what is parsed, not by the mapping: SMALL_CFI_BYTES.)
SMALL_FILE_CODE = 512 * 1024
# CFI of at most this many bytes is built in this process: its rows take milliseconds (the
# interpreter's work is linear in the bytes, about 1 us a byte: libc's 150 KB take 0.15 s), which
# would otherwise wait behind the helper's build of a large file. Anything larger is built in a
# helper, under its time limit: a small mapping may carry a large .eh_frame, or name a large
# debug file, and what runs here cannot be killed.
SMALL_CFI_BYTES = 64 * 1024
# CFI of at most this many bytes, of a file whose code mapping is small, is built by the small
# files' own helper (RowSource): a second's work at most, never behind a large file's seconds.
QUICK_CFI_BYTES = 1 << 20

# Below this share of the budget free, only files whose code was sampled are loaded.
LAZY_BELOW = 0.25
# A loaded file no walk used for this long gives its rows to a file that needs room.
DEFAULT_IDLE_S = 120.0
SWEEP_INTERVAL_S = 5.0
DEMAND_POLL_S = 0.25

# unwind_process holds this many mappings (profile.h UNWIND_MAX_MAPPINGS); past it, the lowest
# addresses are kept and the rest counted.
MAX_MAPPINGS = 256
MAPPING_NATIVE = 0  # profile.h: struct unwind_mapping.kind (the runtimes' own come with their ranges)

FileKey = tuple[str, int]  # (dev, inode), as Mapping.identity
# The vDSO is an ELF image the kernel maps into every process (clock_gettime runs there); it has
# no file, but the same bytes everywhere, so it is read from this process and keyed by its name.
VDSO = "[vdso]"
_VDSO_KEY: FileKey = (VDSO, 0)


@dataclasses.dataclass
class _File:
    file_id: int = 0  # its index in unwind_files from registration (0 once it is known to have no rows)
    first_row: int = 0
    row_count: int = 0
    segments: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # PT_LOADs: (offset, vaddr, size)
    # queued, loaded, no_rows, failed, unopened (no process that maps it could open it yet),
    # no_room (waits for room), evicted
    state: str = "queued"
    users: set[int] = dataclasses.field(default_factory=set)  # tgids mapping it
    # Users that could not open it: an open says what one process may (its credentials, its mount
    # namespace, its exit), so each other user tries in turn, one that maps it later too.
    refused_by: set[int] = dataclasses.field(default_factory=set)
    last_used: float = 0.0  # when a walk last used its rows (as the sweeps saw), or it was loaded
    needed: int = 0  # rows it needs, once known (no_room, evicted)
    demand_seen: int = 0  # its unwind_demand at the last look (going without rows, a sweep): more means sampled since
    large_cfi: bool = False  # its mapping is small but its CFI is not: for the worker that may wait for the helper


class UnwindRegistry:
    def __init__(self, maps: Any, build: Callable[..., bytes], logger: Any, *, max_files: int, row_budget: int,
                 idle_s: float = DEFAULT_IDLE_S, clock: Callable[[], float] = time.monotonic):
        """``maps``: the sampler's UnwindMaps. ``build(fd, path, open_debug, may_wait=...)``: the
        packed rows of the file open on ``fd`` (ValueError when it has none to give; NeedsHelper
        when they would wait for the helper and ``may_wait`` is false)."""
        self._maps = maps
        self.idle_s = idle_s
        self._clock = clock
        self._build = build
        self.log = logger
        # A process's runtime code: (start, end, kind) ranges the kernel walks as that runtime's
        # frames (profile.h MAPPING_V8_*); set by the V8 room (v8/runtimes.py) when it runs.
        self.runtime_code: Callable[[ProcessInfo], Sequence[tuple[int, int, int]]] = lambda info: ()
        self._space = RowSpace(row_budget)
        self._free_ids = list(range(max_files - 1, 0, -1))  # 0 means "no rows"
        self._files: dict[FileKey, _File] = {}
        self._processes: dict[int, ProcessInfo] = {}
        self._running: set[int] | None = None  # note_running's; None until the first report
        self._lock = threading.Lock()
        # Files waiting for rows, with a process and mapping to open them by. A cold start on a
        # busy host queues hundreds; the worker takes the most wanted first (_priority).
        self._pending: dict[FileKey, tuple[ProcessInfo, Mapping]] = {}
        self._wake = threading.Condition(self._lock)
        self._workers: list[threading.Thread] = []
        self._closing = threading.Event()
        self.stats = dict.fromkeys(
            ("files_loaded", "files_without_rows", "files_failed", "rows_loaded", "rows_freed",
             "row_budget_exhausted", "file_ids_exhausted", "mappings_dropped", "processes", "files_waiting",
             "files_waiting_for_room", "files_evicted", "files_evicted_over_share", "rows_evicted", "row_budget_free",
             "files_over_time", "files_left_to_helper", "files_refused_to_a_process", "files_unopened", "worker_errors"), 0)
        self.stats["row_budget_free"] = row_budget
        self._sweeper = Periodic("unwind-usage", SWEEP_INTERVAL_S, self.sweep, logger)

    # -- the process side -------------------------------------------------------------------------

    def register(self, info: ProcessInfo) -> None:
        """Write ``info``'s mappings to the kernel (again, after its maps changed); queue the
        files not seen yet."""
        if info.kernel_thread or info.exited or _is_ours(info):
            return
        with self._lock:
            before = self._processes.get(info.pid)
            self._processes[info.pid] = info
            if before is not None:  # its maps were read again: let go of what it unmapped
                self._release(info.pid, {_key(mapping) for mapping in before.mappings} - {_key(mapping) for mapping in info.mappings})
            for mapping in info.mappings:
                key = _key(mapping)
                if key is None:
                    continue
                file = self._files.get(key)
                if file is None:
                    file = self._files[key] = _File()
                    if not self._queue(key, file, info, mapping):
                        file.state = "failed"
                elif file.state == "unopened" and info.pid not in file.refused_by and key not in self._pending:
                    self._queue(key, file, info, mapping)  # (one none of its users could open: this one has not tried)
                file.users.add(info.pid)
            self.stats["processes"] = len(self._processes)
            self.stats["files_waiting"] = len(self._pending)
            self._write_process(info)
            self._ensure_workers()

    def _queue(self, key: FileKey, file: _File, info: ProcessInfo, mapping: Mapping) -> bool:
        """Give the file an id and queue it for the workers, to be opened by ``info``'s mapping;
        False when no id is left (counted)."""
        if not self._free_ids:
            self.stats["file_ids_exhausted"] += 1
            return False
        file.file_id, file.state = self._free_ids.pop(), "queued"
        self._maps.demand[self._maps.demand.Key(file.file_id)] = self._maps.demand.Leaf(0)
        self._pending[key] = (info, mapping)
        self._wake.notify_all()  # the workers wait for different files
        return True

    def file_state(self, key: FileKey) -> str | None:
        """Where the rows of the file ``key`` (a mapping's identity) stand: queued, loaded,
        unopened... (_File.state); None for a file no registered process maps."""
        with self._lock:
            file = self._files.get(key)
            return file.state if file is not None else None

    def forget(self, tgid: int) -> None:
        """The process exited: drop its mappings, and the rows of files no one maps any more."""
        with self._lock:
            info = self._processes.pop(tgid, None)
            if info is None:
                return
            self._release(tgid, {_key(mapping) for mapping in info.mappings})
            self.stats["processes"] = len(self._processes)
        try:
            del self._maps.processes[self._maps.processes.Key(tgid)]
        except KeyError:
            pass

    def _release(self, tgid: int, keys: set) -> None:
        """``tgid`` maps these files no more: the rows of those no one maps are freed."""
        for key in keys:
            file = self._files.get(key) if key is not None else None
            if file is not None:
                file.users.discard(tgid)
                file.refused_by.discard(tgid)
                if not file.users:
                    self._pending.pop(key, None)
                    self._free(key, file)
        self.stats["files_waiting"] = len(self._pending)

    def _write_process(self, info: ProcessInfo) -> None:
        table = self._maps.processes
        leaf = table.Leaf()
        # Anonymous ones too (JIT code): the kernel then knows the pc and steps by frame pointer
        # instead of asking for the maps again. Not [vsyscall], in the kernel's half: the kernel's
        # search compares addresses below 2^63 only.
        mappings = [mapping for mapping in info.mappings if mapping.end <= _USER_SPACE_END][:MAX_MAPPINGS]
        pieces = _pieces(mappings, self.runtime_code(info))
        if len(pieces) > MAX_MAPPINGS:
            self.stats["mappings_dropped"] += len(pieces) - MAX_MAPPINGS
            pieces = pieces[:MAX_MAPPINGS]
        for slot, (start, end, mapping, kind) in enumerate(pieces):
            entry = leaf.mappings[slot]
            entry.start, entry.end, entry.kind = start, end, kind
            key = _key(mapping) if mapping is not None else None
            file = self._files.get(key) if key is not None else None
            if file is None or not file.file_id:
                continue
            if file.state == "queued":  # the kernel counts the frames that wait for it
                entry.file_id = file.file_id
            elif (bias := _bias(file.segments, mapping)) is not None:
                entry.bias, entry.file_id = bias, file.file_id
        leaf.count = len(pieces)
        table[table.Key(info.pid)] = leaf

    # -- the file side ----------------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        if not self._workers:
            self._workers = [threading.Thread(target=self._work, args=(small_only,), daemon=True,
                                              name="unwind-tables-small" if small_only else "unwind-tables")
                             for small_only in (False, True)]
            for worker in self._workers:
                worker.start()
            self._sweeper.start()

    def _next(self, small_only: bool) -> tuple[FileKey, _File, ProcessInfo, Mapping] | None:
        with self._lock:
            while True:
                if self._closing.is_set():
                    return None
                candidates = self._eligible([key for key, (_, mapping) in self._pending.items()
                                             if _is_small(mapping) and not self._files[key].large_cfi]
                                            if small_only else list(self._pending))
                if candidates:
                    break
                # Files that wait for their code to be sampled (the budget is short, or their rows
                # were given back) become wanted when the kernel counts a walk that needed them,
                # which tells no one: look again soon, or a program that runs now is walked by
                # frame pointer for seconds (until the next sweep, for a file given back).
                # (One worker looks, the one that takes any file; it wakes the other.)
                looks = not small_only and bool(self._waiting_for_room())
                self._wake.wait(DEMAND_POLL_S if self._pending or looks else SWEEP_INTERVAL_S)
                if looks and self._queue_wanted(self._waiting_for_room()):  # (what waits now: the lock was let go)
                    self._wake.notify_all()
            key = max(candidates, key=self._priority)
            item = (key, self._files[key], *self._pending.pop(key))
            self.stats["files_waiting"] = len(self._pending)
            return item

    def _eligible(self, keys: list[FileKey]) -> list[FileKey]:
        """The waiting files to build now: all while the budget has room; when it is short, those
        whose code was sampled; and of those, the files of a process within its share first."""
        if not keys:
            return keys
        if self._space.free < self._space.size * LAZY_BELOW:
            keys = [key for key in keys if self._demand(self._files[key].file_id) > 0]
        held, share = self._rows_held(), self._share()
        within = [key for key in keys if any(held.get(pid, 0) < share for pid in self._files[key].users)]
        return within or keys

    def note_running(self, tgids: set[int]) -> None:
        """The processes that used a CPU in the last report (the receiver tells, each report):
        those the budget is shared among."""
        with self._lock:
            self._running = set(tgids)

    def _share(self) -> float:
        """The rows each process that runs may hold while others wait: the budget divided among
        the registered processes that used a CPU in the last report (all of them before the first).
        Sleeping processes claim no share: counted, nine idle shells and daemons cut a running
        program's share to a tenth, and its rows were given to the next process that asked, then
        asked back, round and round, its stacks stopping short each time."""
        running = len(self._running & self._processes.keys()) if self._running is not None else len(self._processes)
        return self._space.size / max(1, running)

    def _rows_held(self) -> dict[int, float]:
        """Rows loaded for each process: each file's divided equally among the processes that map it."""
        held: dict[int, float] = {}
        for file in self._files.values():
            if file.row_count and file.users:
                part = file.row_count / len(file.users)
                for pid in file.users:
                    held[pid] = held.get(pid, 0) + part
        return held

    def _demand(self, file_id: int) -> int:
        demand = self._maps.demand
        try:
            return demand[demand.Key(file_id)].value
        except KeyError:
            return 0

    def _priority(self, key: FileKey) -> float:
        """Samples that waited for the file's rows (the kernel counts them) and processes that
        map it, per byte of code to read: a small program that is running now goes before libc,
        and libc before a large library no one runs."""
        _, mapping = self._pending[key]
        file = self._files[key]
        return (self._demand(file.file_id) + len(file.users)) / (mapping.end - mapping.start)

    def _work(self, small_only: bool) -> None:
        while True:
            try:
                item = self._next(small_only)
            except Exception:  # a dead worker would leave every file after it without rows
                self.stats["worker_errors"] += 1
                log_once(self.log, ("unwind-next-failed", id(self), small_only), "exception",
                         "choosing the next file to build unwind rows for failed; choosing again (counted in worker_errors)")
                self._closing.wait(DEMAND_POLL_S)  # (not at once: the same error would spin a core)
                continue
            if item is None:
                return
            key, file, info, mapping = item
            try:
                self._load(key, file, info, mapping, small_only)
            except Exception:  # one bad file must not stop the others
                self._failed(key, file)
                self.log.exception("could not load unwind rows", path=mapping.path)

    def _leave_to_helper(self, key: FileKey, taken: _File, info: ProcessInfo, mapping: Mapping) -> None:
        with self._lock:
            if self._closing.is_set() or self._files.get(key) is not taken:
                return
            taken.large_cfi = True
            self._pending[key] = (info, mapping)
            self.stats["files_left_to_helper"] += 1
            self.stats["files_waiting"] = len(self._pending)
            self._wake.notify_all()

    def _failed(self, key: FileKey, taken: _File) -> None:
        with self._lock:
            self.stats["files_failed"] += 1
            if self._files.get(key) is taken:
                self._without_rows(taken, "failed")

    def _refused(self, key: FileKey, taken: _File, info: ProcessInfo) -> None:
        """``info``'s process could not open the file: another user that has not tried does,
        else it waits for a process that maps it later."""
        with self._lock:
            self.stats["files_refused_to_a_process"] += 1
            if self._files.get(key) is not taken or self._closing.is_set():
                return
            taken.refused_by.add(info.pid)
            source = self._source(key, taken, excluding=taken.refused_by)
            if source is not None:
                self._pending[key] = source
                self._wake.notify_all()
            else:
                self.stats["files_unopened"] += 1
                self._without_rows(taken, "unopened")
            self.stats["files_waiting"] = len(self._pending)

    def _without_rows(self, file: _File, state: str) -> None:
        """The file will have no rows: its id goes back, its mappings step by frame pointer."""
        file.state = state
        if file.file_id:
            self._free_ids.append(file.file_id)
            file.file_id = 0
            self._write_users(file)

    def _load(self, key: FileKey, taken: _File, info: ProcessInfo, mapping: Mapping, small_only: bool = False) -> None:
        """Build and write the rows of the file ``taken`` from the queue (by ``info``'s mapping).
        The small files' worker does not wait for the large helper: a file whose CFI is more than
        its quick helper takes goes back to the queue for the other (counted as
        files_left_to_helper)."""
        fd = _vdso_file() if key == _VDSO_KEY else open_mapped_file(info, mapping)
        if fd is None:
            self._refused(key, taken, info)
            return
        try:
            segments = _load_segments(fd)
            started = time.monotonic()
            try:
                rows, reason = self._build(fd, mapping.path, lambda path: open_debug_file(info, path), may_wait=not small_only), None
            except NeedsHelper:
                self._leave_to_helper(key, taken, info, mapping)
                return
            except ValueError as error:
                rows, reason = b"", str(error)
                if isinstance(error, BuildTimeout):
                    self.stats["files_over_time"] += 1
            self.log.debug("unwind rows", path=mapping.path, rows=len(rows) // ROW_SIZE, no_rows=reason,
                           seconds=round(time.monotonic() - started, 3), waiting=len(self._pending))
        finally:
            os.close(fd)
        with self._lock:
            file = self._files.get(key)
            # Stopping, or every process mapping it exited meanwhile, and maybe a new one mapped
            # it again: that registration is queued and loads it; rows written here for it too
            # would be overwritten there, their range never given back.
            if self._closing.is_set() or file is not taken:
                return
            file.segments = segments
            count = len(rows) // ROW_SIZE
            if not count:
                self.stats["files_without_rows"] += 1
                self._without_rows(file, "no_rows")
                return
            first = self._allocate(count, file)
            if first is None:  # it waits for room, counting its frames meanwhile
                file.state, file.needed, file.demand_seen = "no_room", count, self._demand(file.file_id)
                self._write_users(file)
                self._count_waiting()
                return
            file.first_row, file.row_count = first, count
            file.state, file.last_used = "loaded", self._clock()
            # Rows, then the mappings' biases, then the count that makes the kernel use them.
            self._write_rows(first, rows)
            self._write_users(file)
            files = self._maps.files
            files[files.Key(file.file_id)] = files.Leaf(first, count)
            self.stats["files_loaded"] += 1
            self.stats["rows_loaded"] += count
            self._count_waiting()

    # -- sharing the budget -----------------------------------------------------------------------

    def _allocate(self, count: int, file: _File) -> int | None:
        first = self._space.allocate(count)
        if first is None:
            self.stats["row_budget_exhausted"] += 1  # (then room is made, if it can be)
            # Which rows walks used since the last sweep, first: the sweeps' marks are up to
            # SWEEP_INTERVAL_S old, and a file a program ran in a second ago would otherwise look
            # idle (ci4 of session 32: with idle_s under that interval, a running program's library
            # was given away as idle and loaded again, back and forth, half its stacks stopping in it).
            self._note_use()
            if (self._evict_for(count, self._idle_files()) or self._evict_for(count, self._files_of_the_exited())
                    or self._evict_over_share(count, file)):
                first = self._space.allocate(count)
        return first

    def _idle_files(self) -> list[FileKey]:
        """Loaded files no walk used for idle_s, least recently used first."""
        now = self._clock()
        return [key for _, key in sorted((file.last_used, key) for key, file in self._files.items()
                                         if file.state == "loaded" and now - file.last_used >= self.idle_s)]

    def _files_of_the_exited(self) -> list[FileKey]:
        """Loaded files that only processes found gone map (the process table marks them; their
        rows are freed when it removes them, a report later)."""
        exited = {pid for pid, info in self._processes.items() if info.exited}
        if not exited:
            return []
        return [key for _, key in sorted((file.last_used, key) for key, file in self._files.items()
                                         if file.state == "loaded" and file.users and file.users <= exited)]

    def _evict_over_share(self, count: int, wanting: _File) -> bool:
        """When a process mapping ``wanting`` holds less than its share: give back rows of files
        mapped only by processes over their share, least recently used first, until ``count``
        rows fit; whether they do."""
        held, share = self._rows_held(), self._share()
        if not any(held.get(pid, 0) < share for pid in wanting.users):
            return False
        over = {pid for pid, rows in held.items() if rows > share}
        candidates = [key for _, key in sorted((file.last_used, key) for key, file in self._files.items()
                                               if file.state == "loaded" and file.users and file.users <= over)]
        evicted = self._evict_for(count, candidates)
        if evicted:
            self.stats["files_evicted_over_share"] += evicted
        return evicted > 0

    def _evict_for(self, count: int, candidates: list[FileKey]) -> int:
        """Give back the rows of ``candidates``, in that order, until ``count`` rows fit in one
        range; how many were evicted (none when even all would not make room: a file larger than
        what they hold, or one range the free space cannot join into)."""
        trial, needed = self._space.copy(), 0
        for key in candidates:
            if trial.largest >= count:
                break
            trial.release(self._files[key].first_row, self._files[key].row_count)
            needed += 1
        if trial.largest < count:
            return 0
        for key in candidates[:needed]:
            self._evict(self._files[key])
        return needed

    def _evict(self, file: _File) -> None:
        """Its rows go back; its mappings keep its id, so the kernel counts the frames that would
        have used them, and it is queued again once there are some (_queue_wanted)."""
        files = self._maps.files
        files[files.Key(file.file_id)] = files.Leaf(0, 0)  # first: no walk reads rows given away
        self._space.release(file.first_row, file.row_count)
        self.stats["files_evicted"] += 1
        self.stats["rows_evicted"] += file.row_count
        file.state, file.needed, file.demand_seen = "evicted", file.row_count, self._demand(file.file_id)
        file.first_row = file.row_count = 0

    def sweep(self) -> None:
        """Every SWEEP_INTERVAL_S: note which files' rows walks used (and reset the marks), and
        queue again the files that wait for room or were evicted once their code was sampled and
        there is room for them."""
        with self._lock:
            self._note_use()
            self._queue_wanted(self._waiting_for_room())
            self._count_waiting()
            self._wake.notify_all()

    def _note_use(self) -> None:
        """The files whose rows a walk used since the kernel's marks were last read were used now;
        the marks are reset. (With the lock held: a mark read is applied before anyone evicts.)"""
        used = self._maps.used
        try:  # one system call for the whole array, as plain ints (a lookup each costs 20 ms a sweep)
            marked = [key for key, value in used.items_lookup_batch() if value]
        except Exception:  # noqa: BLE001 - a kernel without batch lookups of arrays
            marked = [key.value for key, value in used.items() if value.value]
        if not marked:
            return
        for file_id in marked:
            used[used.Key(file_id)] = used.Leaf(0)
        now = self._clock()
        by_id = {file.file_id: file for file in self._files.values() if file.file_id}
        for file_id in marked:
            if file_id in by_id:
                by_id[file_id].last_used = now

    def _waiting_for_room(self) -> list[FileKey]:
        """Files without rows for want of room (never loaded, or given back), not queued."""
        return [key for key, file in self._files.items() if file.state in ("no_room", "evicted") and key not in self._pending]

    def _queue_wanted(self, keys: list[FileKey]) -> int:
        """Queue again those of ``keys`` (files waiting for room) whose code a walk needed since
        the last look (it runs now, not only before it went idle), when there is room for them or
        rows no walk uses to take; how many. Called with the lock held: by the sweep, and by a
        worker while it waits (then within DEMAND_POLL_S of the walk)."""
        now, queued = self._clock(), 0
        idle_rows = sum(file.row_count for file in self._files.values() if file.state == "loaded" and now - file.last_used >= self.idle_s)
        # Rows of processes over their share, which a file of a process under its share may take
        # (_evict_over_share): without them, a file that found no room while the others were
        # still loading waited for good behind a process that holds more than its share and is
        # never idle (ci4 of session 31: free rows in pieces, none idle, the newcomer's library
        # no_room for the rest of the run).
        held, share = self._rows_held(), self._share()
        over = {pid for pid, rows in held.items() if rows > share}
        over_share_rows = sum(file.row_count for file in self._files.values()
                              if file.state == "loaded" and file.users and file.users <= over) if over else 0
        for key in keys:
            file = self._files[key]
            demand, seen = self._demand(file.file_id), file.demand_seen
            file.demand_seen = demand
            takes = over_share_rows if any(held.get(pid, 0) < share for pid in file.users) else 0
            if demand <= seen or file.needed > self._space.largest + idle_rows + takes:
                continue
            source = self._source(key, file)
            if source is not None:
                file.state = "queued"
                self._pending[key] = source
                queued += 1
        return queued

    def _source(self, key: FileKey, file: _File, excluding: set[int] = frozenset()) -> tuple[ProcessInfo, Mapping] | None:
        """A process that maps the file (not one of ``excluding``), and its mapping: what a build
        opens it by."""
        for pid in file.users - excluding:
            info = self._processes.get(pid)
            mapping = next((mapping for mapping in info.mappings if _key(mapping) == key), None) if info else None
            if mapping is not None:
                return info, mapping
        return None

    def _count_waiting(self) -> None:
        self.stats["files_waiting_for_room"] = sum(1 for file in self._files.values() if file.state in ("no_room", "evicted"))
        self.stats["files_waiting"] = len(self._pending)
        self.stats["row_budget_free"] = self._space.free

    def _write_users(self, file: _File) -> None:
        for tgid in list(file.users):
            process = self._processes.get(tgid)
            if process is not None:
                self._write_process(process)

    def _write_rows(self, first: int, rows: bytes) -> None:
        table = self._maps.rows
        count = len(rows) // ROW_SIZE
        keys = (table.Key * count)(*range(first, first + count))
        values = (table.Leaf * count).from_buffer_copy(rows)
        table.items_update_batch(keys, values)

    def _free(self, key: FileKey, file: _File) -> None:
        del self._files[key]
        if file.file_id:
            files = self._maps.files
            files[files.Key(file.file_id)] = files.Leaf(0, 0)
            self._free_ids.append(file.file_id)
        if file.row_count:
            self._space.release(file.first_row, file.row_count)
            self.stats["rows_freed"] += file.row_count

    def close(self) -> None:
        """Stop the worker before the maps it writes to are closed (a file still being parsed
        is abandoned)."""
        with self._lock:
            self._closing.set()
            self._wake.notify_all()
        self._sweeper.close(SWEEP_INTERVAL_S + 1)
        for worker in self._workers:
            worker.join(timeout=5)


def _pieces(mappings: list[Mapping], code: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, Mapping | None, int]]:
    """(start, end, mapping, kind) for the kernel, by start: each mapping, cut where a range of
    runtime code starts or ends inside it (V8's builtins lie within node's text), each piece of the
    kind of the range it lies in (MAPPING_NATIVE outside them); and the parts of those ranges no
    mapping covers yet, without a mapping (a JVM's code cache is reserved whole and made
    executable as it fills: a pc there is the JVM's before its maps are read again)."""
    code = sorted(code)
    lows = [low for low, _, _ in code]
    out = []
    for mapping in mappings:
        # The ranges that overlap it: those starting below its end, back to the first that ends after its start.
        first = last = bisect.bisect_left(lows, mapping.end)
        while first > 0 and code[first - 1][1] > mapping.start:
            first -= 1
        near = code[first:last]
        cuts = sorted({mapping.start, mapping.end} | {at for low, high, _ in near for at in (low, high) if mapping.start < at < mapping.end})
        for start, end in zip(cuts, cuts[1:]):
            kind = next((kind for low, high, kind in near if low <= start and end <= high), MAPPING_NATIVE)
            out.append((start, end, mapping, kind))
    covered = [(start, end) for start, end, _, _ in out]
    for low, high, kind in code:
        for start, end in _uncovered(low, high, covered):
            out.append((start, end, None, kind))
    return sorted(out, key=lambda piece: piece[0])


def _uncovered(low: int, high: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [low, high) outside the sorted, disjoint ``covered`` ranges."""
    out, at = [], low
    for start, end in covered[max(0, bisect.bisect_right(covered, (low, low)) - 1):]:
        if start >= high:
            break
        if end <= at:
            continue
        if start > at:
            out.append((at, start))
        at = max(at, end)
    if at < high:
        out.append((at, high))
    return out


def _is_ours(info: ProcessInfo) -> bool:
    """This collector, or its row builder. Their stacks stay with frame pointers: BCC's
    compiler maps LLVM, whose million rows would take half the default row budget and seconds of
    a cold start for a process that is not what anyone came to profile."""
    if info.pid == _OWN_PID:
        return True
    return info.parent_pid == _OWN_PID and any(child.pid == info.pid for child in multiprocessing.active_children())


def _is_small(mapping: Mapping) -> bool:
    return mapping.end - mapping.start <= SMALL_FILE_CODE


def _key(mapping: Mapping) -> FileKey | None:
    """Which file's rows a mapping uses; None for one without a file (anonymous, JIT code)."""
    if mapping.file_backed:
        return mapping.identity
    return _VDSO_KEY if mapping.path == VDSO else None


def _vdso_file() -> int | None:
    """An fd on a copy of this process's vDSO image (a memfd), or None."""
    with open("/proc/self/maps") as maps:
        line = next((line for line in maps if line.rstrip().endswith(VDSO)), None)
    if line is None:
        return None
    start, end = (int(part, 16) for part in line.split()[0].split("-"))
    with open("/proc/self/mem", "rb", buffering=0) as memory:
        memory.seek(start)
        image = memory.read(end - start)
    fd = os.memfd_create("vdso", os.MFD_CLOEXEC)
    os.write(fd, image)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _load_segments(fd: int) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, size in the file) of each executable loadable segment:
    what maps a file offset to the addresses the rows use. Only executable ones, like the
    mappings they are matched with: the page where a read-only segment ends and the code
    begins belongs to both, and only the code's gives the right bias."""
    with os.fdopen(os.dup(fd), "rb") as stream:
        try:
            elf = BoundedElf(stream)
            return [(s.offset, s.vaddr, s.filesz) for s in segment_headers(elf) if s.type == PT_LOAD and s.flags & _PF_X]
        except Exception:  # not ELF, or cut short: no rows either
            return []


_PAGE = 4096
_PF_X = 1
_OWN_PID = os.getpid()
_USER_SPACE_END = 1 << 63


def _bias(segments: list[tuple[int, int, int]], mapping: Mapping) -> int | None:
    """pc - bias is the file address. The segment the mapping was made from holds its file
    offset, rounded down to a page as mmap() takes it; its (vaddr - offset) maps one to the other."""
    for offset, vaddr, size in segments:
        if offset - offset % _PAGE <= mapping.offset < offset + size:
            return mapping.start - mapping.offset - (vaddr - offset)
    return None


class NeedsHelper(Exception):  # noqa: N818 - not an error: a request to ask again, willing to wait
    """The file's rows are not in the cache and must be built by the large helper, which the
    caller would not wait for."""


class RowSource:
    """A file's rows for the registry: from the disk cache, else built in a helper process
    (builder_process.py) from the bytes read here, from exactly the file the registry opened
    (deleted, or in another mount namespace).

    Two helpers, so that a small file never waits behind a large one: the large helper builds for
    the worker that takes any file (libLLVM's rows take it 8 s, a crafted file up to its time
    limit), the quick one for the small files' worker, CFI of at most QUICK_CFI_BYTES only.
    (ci3 of session 28: a program started beside a process that mapped libLLVM had its 72 KB of
    CFI built 4 s later, its stacks stopping in its library meanwhile.)"""

    def __init__(self, cache_dir: str, logger: Any, build_timeout_s: float = MAX_BUILD_S):
        self.cache = RowCache(cache_dir, logger)
        self.log = logger
        self.build_timeout_s = build_timeout_s
        self._large, self._quick = _Helper(), _Helper()

    def start(self) -> None:
        """Start the large helper now (it takes a few tenths of a second), not at the first file
        the cache does not have; keep the cache within its bounds. (The quick one starts when a
        small file first needs it: most hosts' small files have little CFI, built here.)"""
        self.cache.prune()
        self._large.start()

    def __call__(self, fd: int, path: str, open_debug: Callable[[str], int | None] = open_host_file, *, may_wait: bool = True) -> bytes:
        """The rows of the file open as ``fd``, mapped as ``path``; ``open_debug(candidate)``
        opens a separate debug file as the process that maps it would (None: not there). CFI of
        at most SMALL_CFI_BYTES is built here, anything larger in a helper, within its time:
        the large helper, unless ``may_wait`` is false (the small files' worker), then the quick
        one if the CFI is at most QUICK_CFI_BYTES, else NeedsHelper.

        Rows are cached by a hash of what they are built from (rows.CfiInput: the file's
        .eh_frame, its .debug_frame or its debug file's), never by the build id it declares: a
        program carrying another's build id would otherwise hand that one's processes its rows,
        here and in the cache on disk across restarts. Those bytes are read once, hashed, and the
        rows built from that copy: a file rewritten between a hash and a second read would have
        had its rows stored under the key of what it held before (another file's, libc's, for
        every process that maps libc). They are read no further than the size the file had when
        it was opened here; one whose size changed meanwhile has no rows (counted)."""
        with os.fdopen(os.dup(fd), "rb") as stream:
            try:
                elf = BoundedElf(stream)
                headers = ElfHeaders.read_headers(elf, path)
            except Exception as error:
                raise NoRows(f"not an ELF file: {error}") from None
            candidates = debug_file_candidates(headers.build_id, headers.debuglink, path)
            with contextlib.closing(_debug_files(candidates, open_debug)) as debug_files:
                cfi = cfi_of(elf, debug_files)
            if elf.grew():
                raise NoRows("the file's size changed while it was read")

        def build() -> bytes:
            if cfi.size <= SMALL_CFI_BYTES:
                return rows_from(cfi)
            if may_wait:
                return self._large.build(cfi, self.build_timeout_s)
            if cfi.size <= QUICK_CFI_BYTES:
                return self._quick.build(cfi, self.build_timeout_s)
            raise NeedsHelper(f"{cfi.size} bytes of CFI")

        return self.cache.get_or_build(cfi.digest(), build)

    def close(self) -> None:
        """Stop the helpers, abandoning builds under way."""
        self._large.close()
        self._quick.close()


class _Helper:
    """One helper process, started when first asked for (again after it died), building one
    file at a time."""

    def __init__(self) -> None:
        self._process: BuilderProcess | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._building = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._running()

    def _running(self) -> BuilderProcess:
        """The helper, a new one if there is none or it died (the OOM killer) while idle."""
        if self._closed:
            raise NoRows("stopping")
        if self._process is None or not self._process.alive():
            if self._process is not None:
                self._process.stop()
            self._process = BuilderProcess()
        return self._process

    def build(self, cfi: CfiInput, timeout_s: float) -> bytes:
        with self._building:
            with self._lock:
                helper = self._running()
            # Not tried again when the helper dies: the file may be what killed it (memory). The
            # next file gets a new helper.
            try:
                return helper.build(cfi, stopping=lambda: self._closed, timeout_s=timeout_s)
            except HelperDied:
                if self._closed:  # close() stopped it under this build: not the file's doing
                    raise NoRows("stopping") from None
                raise

    def close(self) -> None:
        with self._lock:
            process, self._process = self._process, None
            self._closed = True
        if process is not None:
            process.stop()


def _debug_files(candidates: Sequence[str], open_debug: Callable[[str], int | None]) -> Iterator[BinaryIO]:
    """The candidates that open (as the process would open them), each open until the next is
    asked for: a debug file is read only when the file has no .debug_frame of its own."""
    for candidate in candidates:
        fd = open_debug(candidate)
        if fd is not None:
            with os.fdopen(fd, "rb") as stream:
                yield stream
