"""One report's budget for naming runtimes' frames: what the runtimes (python/, v8/, hotspot/)
read from the processes' memory to name the frames of one report, all processes together.

Each runtime bounds what one process may read a report, but N processes then cost N budgets: six
forged JVMs put 10 to 15 s between reports due every 2, eight Node processes whose names are
deep cons strings 10.5 s. So the report builder starts one ReportBudget a report, gives it to
every runtime's ``new_report``, and every read a runtime makes to name a frame goes through it
(``BudgetedMemory``): its bytes, READ_COST more for the read itself (a read of 2 bytes costs
nearly what one of 4 KiB does: about 8 us of system calls, the page map's check among them), and
the time it took (a page in swap is read from the disk). The bytes are shared among the report's
processes that a runtime names, in the order the report names them: each may spend its share
(the bytes divided among them), and past it only what is not kept for the processes still to
come. However many processes overspend, the report's reads stay within the budget, and a process
within its share is named. The seconds are a bound for all together, not shared out, and count
the report thread's own time (CPU time: user and system), not its waits for the interpreter
lock, which the agent's other threads hold (a JVM starting while they parse its files: 90 to
300 us a read, where 8 is usual; on a loaded host milliseconds), save for a read of a page not
in memory, which may wait for a disk: its time by the clock. Those reads take half the seconds at
most (WAITED_SHARE), so that a report whose reads all wait still ends within its interval. A
process that read slowly when they ran out goes last the next report. A read refused raises NamingBudgetSpent, a MemoryReadError
(every namer leaves a frame it cannot read unnamed), counted in its runtime's
``report_budget_refused``; the report carries the stacks of a process refused to the next report,
once, where what was read now is cached, and names the processes refused last report after the
others (report.py).

Threading: a budget is the report thread's alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Hashable

from .memory import MemoryReadError, ProcessMemory

# Bytes of reads for naming one report's frames, all processes and runtimes together, each read
# counted READ_COST more: 32,000 reads of a few bytes (0.3 s here), or 8 MiB in large ones (a
# CPython line table's decoding, the costliest per byte, takes 1 s for 2 MiB: its own bound).
DEFAULT_READ_BYTES = 8 << 20
READ_COST = 256
# Seconds of reads, all together: the receiver gives its reporter interval. A bound for slow
# reads: the bytes' comes first at 8 us a read.
DEFAULT_READ_SECONDS = 1.0
# Of the seconds, what reads of pages not in memory may take, by the clock: they wait for a disk,
# and before one the process's maps (up to 4 MiB) and mount tables are read (memory.py's slow
# check). With all of the interval, a process whose code objects point at such pages, its maps
# 3.9 MB, made every report 1.12-1.23 s long, due every 1: reads took the interval, the rest of
# the report came after it (tests/test_hostile_runtimes.py).
WAITED_SHARE = 0.5
REFUSED_STAT = "report_budget_refused"  # in each runtime's stats: reads the budget refused


class NamingBudgetSpent(MemoryReadError):
    """This report's reads for naming frames are spent, or this process's share of them."""

    def __init__(self, pid: int, address: int, size: int):
        super().__init__(pid, address, size, "this report's budget of reads for naming frames is spent (named in a later report)")


class _Shared:
    """An amount shared by the processes a report names one after another: each may take its
    share; past it, what is not kept for the processes still to come (their shares)."""

    __slots__ = ("amount", "share", "waiting", "spent", "mine")

    def __init__(self, amount: float) -> None:
        self.amount, self.share, self.waiting, self.spent = amount, amount, 0, 0.0
        self.mine = math.inf  # what the process named now has spent (none named yet: no share)

    def share_among(self, processes: int) -> None:
        self.share, self.waiting = self.amount / max(1, processes), processes

    def begin(self, counted: bool) -> None:
        """The next process: ``counted``, one of those shared among (else it has no share)."""
        if counted and self.waiting:
            self.waiting -= 1
            self.mine = 0.0
        else:
            self.mine = math.inf

    def allows(self, cost: float) -> bool:
        """Whether the process named now may spend ``cost`` more."""
        if self.spent + cost > self.amount:
            return False
        return self.mine + cost <= self.share or self.spent + cost <= self.amount - self.waiting * self.share

    def spend(self, cost: float) -> None:
        self.spent += cost
        self.mine += cost


class ReportBudget:
    """One report's reads for naming frames: ``read_bytes`` (with READ_COST a read), shared among
    the processes given to share_among, begun one at a time; ``read_seconds`` in all, of which
    reads of pages not in memory take WAITED_SHARE at most."""

    def __init__(self, read_bytes: float = DEFAULT_READ_BYTES, read_seconds: float = DEFAULT_READ_SECONDS,
                 clock: Callable[[], float] = time.monotonic, cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self._bytes, self._clock, self._cpu_clock = _Shared(read_bytes), clock, cpu_clock
        self.read_seconds, self._seconds = read_seconds, 0.0
        self._waited = 0.0  # (of the seconds, the reads of pages not in memory's)
        self._counted: set[Hashable] = set()
        self.refused: set[int] = set()  # pids a read was refused for
        self.reads = 0  # made

    def share_among(self, processes: Collection[Hashable]) -> None:
        """The processes that share the budget (keys: a pid, a pid and its start): those a
        runtime names (the others read nothing)."""
        self._counted = set(processes)
        self._bytes.share_among(len(self._counted))

    def begin(self, process: Hashable) -> None:
        """The report names ``process``'s stacks now, until the next begin (a process not
        shared among, or begun before, has no share: it may spend what no other is kept)."""
        counted = process in self._counted
        self._counted.discard(process)
        self._bytes.begin(counted)

    @property
    def spent(self) -> tuple[float, float]:
        """(bytes, seconds) spent: the bytes with READ_COST a read."""
        return self._bytes.spent, self._seconds

    @property
    def waited(self) -> float:
        """Of the seconds spent, those of reads of pages not in memory (by the clock)."""
        return self._waited

    def read(self, memory: ProcessMemory, address: int, size: int, stats: dict | None = None) -> bytes:
        """``memory.read(address, size)``, if the budget allows it; else NamingBudgetSpent,
        counted in ``stats``."""
        cost = size + READ_COST
        # (whether a read will wait is known only as it is made: once the waits' share is spent,
        # every read is refused, and the report goes on)
        if not (self._bytes.allows(cost) and self._seconds < self.read_seconds and self._waited < self.read_seconds * WAITED_SHARE):
            self.refused.add(memory.pid)
            if stats is not None:
                stats[REFUSED_STAT] = stats.get(REFUSED_STAT, 0) + 1
            raise NamingBudgetSpent(memory.pid, address, size)
        started, worked = self._clock(), self._cpu_clock()
        try:
            return memory.read(address, size)
        finally:
            self.reads += 1
            self._bytes.spend(cost)
            if memory.waited:
                took = self._clock() - started
                self._waited += took
            else:
                took = self._cpu_clock() - worked
            self._seconds += took


class Unbudgeted:
    """Reads outside reports (a runtime's own use, tests): as the memory gives them."""

    refused: frozenset[int] = frozenset()

    @staticmethod
    def read(memory: ProcessMemory, address: int, size: int, stats: dict | None = None) -> bytes:
        return memory.read(address, size)


UNBUDGETED = Unbudgeted()


class BudgetedMemory:
    """A process's memory (ProcessMemory's interface), read within ``budget``: the report's,
    given by the runtime's new_report. Refusals are counted in ``stats`` (the runtime's)."""

    def __init__(self, memory: ProcessMemory, stats: dict) -> None:
        self.memory, self.stats = memory, stats
        self.budget: ReportBudget | Unbudgeted = UNBUDGETED
        stats.setdefault(REFUSED_STAT, 0)

    @property
    def pid(self) -> int:
        return self.memory.pid

    @property
    def exited(self) -> bool:
        return self.memory.exited

    def read(self, address: int, size: int) -> bytes:
        return self.budget.read(self.memory, address, size, self.stats)

    def close(self) -> None:
        self.memory.close()
