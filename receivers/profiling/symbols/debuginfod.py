"""Debug files fetched by build id from debuginfod servers, for the stripped files of sampled
processes (elfutils' protocol: GET <server>/buildid/<hex>/debuginfo; Debian, Ubuntu, Fedora, Arch
and openSUSE run public ones, and ``debuginfod`` serves a directory of one's own).

The build id is what a sampled process's file claims, so whatever a fetch costs is bounded:

- Nothing waits for the network: ``debug_file`` answers at once, with the file when it is on disk
  and nothing otherwise, and queues a fetch that this module's threads make. The file's frames
  stay unnamed meanwhile; the symbolizer asks again, and the reports after the fetch name them.
- A fetch takes at most ``timeout`` a read and ``fetch_timeout`` in all, and at most
  ``max_file_size_mib`` (an answer that says it is longer is refused unread, one that goes on
  is cut there), read as it comes, never decoded (no compression bomb).
- What arrives is checked before it is kept: an ELF file of the machine asked for whose GNU build
  id is the one asked for. Anything else is deleted, counted, and taken as a miss.
- Fetches are rationed for each process and for the host (so many a minute, token buckets), and
  queued up to MAX_QUEUED: one asked past an allowance is counted and left for a later ask.
- A build id no server has, or whose fetch failed, is not asked again for
  ``negative_cache_expiry``; a server that cannot be reached is not asked for SERVER_DOWN_S.
- Files are kept under ``cache_dir`` within ``cache_size_mib``, the least recently used deleted
  first. The directory must be this user's alone (a file there is taken as the build id's debug
  file), else nothing is kept and nothing fetched.

A fetched file names only the file whose build id it was asked for, and names are kept by that
file's identity as every file's are (symbolizer.py): a process that copies another program's build
id gets that program's names for its own frames, never the other way round.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import requests

from pycollector.logs import log_once
from pycollector.token_bucket import TokenBucket
from pycollector.trusted_directory import UntrustedDirectoryError, check_own_directory

from ..elf.bounded import BoundedElf
from ..elf.headers import elf_build_id

# GNU build ids: 20 bytes (SHA-1, ld's default), 16 (md5, uuid) or 8 (xxhash); a hex string made
# of the bytes the file holds. Anything else is not asked for.
_BUILD_ID = re.compile(r"(?:[0-9a-f]{2}){4,64}")
_SUFFIX = ".debug"
MAX_QUEUED = 64
SERVER_DOWN_S = 60.0
MAX_PROCESSES_RATIONED = 4096  # processes whose allowance is remembered (the oldest forgotten)
MAX_NEGATIVE = 1 << 16  # build ids remembered as missing
_CHUNK = 1 << 16
WORKERS = 2
_STATS = ("requests", "fetched", "fetched_bytes", "cache_hits", "not_found", "failures", "rejected_other_build_id",
          "rejected_not_elf", "rejected_other_machine", "too_large", "over_time", "rate_limited", "queue_full",
          "negative_cache_hits", "servers_down", "evicted", "invalid_build_ids")


class _Miss(Exception):
    """This server does not have the file (or gave one that is not it): the next one may."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class DebuginfodClient:
    """``urls``: the servers, asked in order. The other settings are the profiling receiver's
    ``debuginfod`` keys (config.py)."""

    def __init__(self, urls: list[str], *, cache_dir: str, cache_bytes: int, max_file_bytes: int, timeout_s: float,
                 fetch_timeout_s: float, negative_expiry_s: float, fetches_per_minute: int, fetches_per_process_per_minute: int,
                 logger: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.urls = [url.rstrip("/") for url in urls]
        self.cache_dir = cache_dir
        self.cache_bytes = cache_bytes
        self.max_file_bytes = min(max_file_bytes, cache_bytes)
        self.timeout_s, self.fetch_timeout_s, self.negative_expiry_s = timeout_s, fetch_timeout_s, negative_expiry_s
        self.per_minute, self.per_process_per_minute = fetches_per_minute, fetches_per_process_per_minute
        self.log = logger
        self._clock = clock
        self.stats: dict[str, float] = dict.fromkeys(_STATS, 0)
        self.stats["fetch_seconds"] = 0.0
        self._lock = threading.Condition()
        self._queue: collections.deque[tuple[str, str, str]] = collections.deque()
        self._asked: set[str] = set()  # queued or being fetched
        self._missing: collections.OrderedDict[str, float] = collections.OrderedDict()  # build id -> until when
        self._kept: collections.OrderedDict[str, int] = collections.OrderedDict()  # build id -> bytes, least recently used first
        self._kept_bytes = 0
        self._host_allowance = self._allowance(fetches_per_minute)
        self._process_allowances: collections.OrderedDict[Hashable, TokenBucket] = collections.OrderedDict()
        self._down_until: dict[str, float] = {}
        self._closed = False
        self._threads: list[threading.Thread] = []
        self.usable = self._open_cache()

    # -- asked by the symbolizer (its loading threads) -------------------------------------------

    def debug_file(self, build_id: str | None, machine: str, owner: Hashable, path: str = "") -> str | None:
        """The path of the debug file of ``build_id`` for a file of ``machine`` (e_machine) when it
        is on disk; otherwise None, and a fetch queued if ``owner`` (the process that maps the
        file) and the host may have one now. ``path``: the file's, for the log."""
        if not self.usable or not build_id:
            return None
        with self._lock:
            if not _BUILD_ID.fullmatch(build_id):
                self.stats["invalid_build_ids"] += 1
                return None
            if build_id in self._kept:
                self._kept.move_to_end(build_id)
                self.stats["cache_hits"] += 1
                return self._path(build_id)
            now = self._clock()
            until = self._missing.get(build_id)
            if until is not None:
                if now < until:
                    self.stats["negative_cache_hits"] += 1
                    return None
                del self._missing[build_id]
            if build_id in self._asked:
                return None
            if not self._servers_up(now):
                self.stats["servers_down"] += 1
                return None
            if len(self._queue) >= MAX_QUEUED:
                self.stats["queue_full"] += 1
                log_once(self.log, ("debuginfod-put-off", "queue_full"), "warning", "debuginfod: fetches are put off while "
                         f"{MAX_QUEUED} wait (counted: debuginfod_queue_full); their files stay unnamed until a later ask")
                return None
            process = self._process_allowance(owner)
            if not (process.available() and self._host_allowance.available()):
                self.stats["rate_limited"] += 1
                log_once(self.log, ("debuginfod-put-off", "rate_limited"), "warning", "debuginfod: fetches past a process's or the "
                         "host's allowance are put off (counted: debuginfod_rate_limited); their files stay unnamed until a later ask",
                         fetches_per_minute=self.per_minute, fetches_per_process_per_minute=self.per_process_per_minute)
                return None
            process.spend(1)
            self._host_allowance.spend(1)
            self._asked.add(build_id)
            self._queue.append((build_id, machine, path))
            self._start_worker()
            self._lock.notify()
        self.log.info("a stripped file's names wait for its debug file from debuginfod; later reports name its frames",
                      path=path, build_id=build_id)
        return None

    def forget(self, build_id: str) -> None:
        """The kept file of ``build_id`` is gone (deleted by hand): fetch it again when asked."""
        with self._lock:
            size = self._kept.pop(build_id, None)
            if size is not None:
                self._kept_bytes -= size

    def awaits(self, build_id: str | None) -> bool:
        """Whether a fetch of ``build_id`` is queued or under way."""
        with self._lock:
            return build_id in self._asked

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._lock.notify_all()

    # -- the cache on disk ----------------------------------------------------------------------

    def _open_cache(self) -> bool:
        """Check the cache directory (made if missing) and take stock of what it holds."""
        if not self.urls:
            return False
        try:
            check_own_directory(self.cache_dir, create=True)
        except (OSError, UntrustedDirectoryError) as error:
            self.log.warning("debuginfod: the cache directory cannot be used, so no debug file is fetched "
                             "(set debuginfod.cache_dir to a directory only this user can write)",
                             directory=self.cache_dir, error=str(error))
            return False
        found = []
        with os.scandir(self.cache_dir) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.name.startswith(".fetch-"):  # (a fetch cut short by a stop)
                        os.unlink(entry.path)
                        continue
                    build_id = entry.name[:-len(_SUFFIX)]
                    if entry.name.endswith(_SUFFIX) and _BUILD_ID.fullmatch(build_id) and entry.is_file(follow_symlinks=False):
                        status = entry.stat(follow_symlinks=False)
                        found.append((status.st_mtime, build_id, status.st_size))
        for _, build_id, size in sorted(found):
            self._kept[build_id] = size
            self._kept_bytes += size
        self._evict()
        return True

    def _path(self, build_id: str) -> str:
        return os.path.join(self.cache_dir, build_id + _SUFFIX)

    def _keep(self, build_id: str, temporary: str, size: int) -> None:
        os.utime(temporary)  # (the least recently used go first, after a restart too)
        os.replace(temporary, self._path(build_id))
        with self._lock:
            self._kept[build_id] = size
            self._kept_bytes += size
            self._evict()

    def _evict(self) -> None:
        """The least recently used files deleted until the rest are within the budget (the lock held)."""
        while self._kept_bytes > self.cache_bytes and self._kept:
            build_id, size = self._kept.popitem(last=False)
            self._kept_bytes -= size
            self.stats["evicted"] += 1
            with contextlib.suppress(OSError):
                os.unlink(self._path(build_id))

    # -- allowances -----------------------------------------------------------------------------

    def _allowance(self, per_minute: int) -> TokenBucket:
        """So many a minute, as many of them at once."""
        return TokenBucket(per_minute / 60.0, self._clock, burst=per_minute)

    def _process_allowance(self, owner: Hashable) -> TokenBucket:
        allowance = self._process_allowances.get(owner)
        if allowance is None:
            allowance = self._process_allowances[owner] = self._allowance(self.per_process_per_minute)
            while len(self._process_allowances) > MAX_PROCESSES_RATIONED:
                self._process_allowances.popitem(last=False)
        return allowance

    def _servers_up(self, now: float) -> list[str]:
        return [url for url in self.urls if self._down_until.get(url, 0.0) <= now]

    # -- fetching (this module's threads) -------------------------------------------------------

    def _start_worker(self) -> None:
        """Another fetching thread while there are fewer than WORKERS (the lock held)."""
        if len(self._threads) < WORKERS:
            thread = threading.Thread(target=self._work, name=f"debuginfod-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        session = requests.Session()  # (the proxy environment applies: HTTPS_PROXY, NO_PROXY)
        session.headers.update({"Accept-Encoding": "identity", "User-Agent": "pycollector"})
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                build_id, machine, path = self._queue.popleft()
            started = self._clock()
            try:
                found = self._fetch(session, build_id, machine, path)
            finally:
                with self._lock:
                    self.stats["fetch_seconds"] += self._clock() - started
                    self._asked.discard(build_id)
                    if found is False:
                        self._missing[build_id] = self._clock() + self.negative_expiry_s
                        while len(self._missing) > MAX_NEGATIVE:
                            self._missing.popitem(last=False)

    def _fetch(self, session: requests.Session, build_id: str, machine: str, path: str) -> bool | None:
        """Ask each server that is up in turn: True once one gave the file (kept on disk), False
        when none has it or every one asked failed, None when none could be asked."""
        servers = self._servers_up(self._clock())
        if not servers:
            return None
        for url in servers:
            self._count("requests")
            try:
                size = self._fetch_from(session, url, build_id, machine)
            except _Miss as miss:
                self._count(miss.reason)
                if miss.reason != "not_found":
                    log_once(self.log, ("debuginfod", url, miss.reason), "warning",
                             "debuginfod: a server's answer was not the debug file asked for; not kept", server=url,
                             build_id=build_id, reason=miss.reason, detail=str(miss))
                continue
            except (requests.RequestException, OSError) as error:
                with self._lock:
                    self.stats["failures"] += 1
                    self._down_until[url] = self._clock() + SERVER_DOWN_S
                log_once(self.log, ("debuginfod-down", url), "warning", "debuginfod: a server cannot be reached; "
                         "it is not asked again for a while, and what it was asked for not until the negative cache expires",
                         server=url, error=str(error), retry_after_s=SERVER_DOWN_S)
                continue
            self._count("fetched")
            self._count("fetched_bytes", size)
            self.log.info("debuginfod: fetched a debug file; the reports from now on name its file's frames",
                          path=path, build_id=build_id, server=url, bytes=size)
            return True
        return False

    def _count(self, stat: str, amount: int = 1) -> None:
        with self._lock:  # (two fetching threads)
            self.stats[stat] += amount

    def _fetch_from(self, session: requests.Session, url: str, build_id: str, machine: str) -> int:
        """Fetch the file into the cache from ``url``; its size. Raises _Miss when the server has
        no such file or gave another, requests' errors when it cannot be asked."""
        deadline = self._clock() + self.fetch_timeout_s
        with session.get(f"{url}/buildid/{build_id}/debuginfo", stream=True, timeout=(self.timeout_s, self.timeout_s)) as answer:
            if answer.status_code == 404:
                raise _Miss("not_found")
            if answer.status_code != 200:
                raise requests.HTTPError(f"HTTP {answer.status_code} from {url}", response=answer)
            length = answer.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > self.max_file_bytes:
                raise _Miss("too_large", f"{length} bytes, over {self.max_file_bytes}")
            descriptor, temporary = tempfile.mkstemp(dir=self.cache_dir, prefix=".fetch-")
            try:
                with os.fdopen(descriptor, "w+b") as out:
                    size = self._copy(answer, out, deadline)
                    out.flush()
                    _check(out, build_id, machine)
                self._keep(build_id, temporary, size)
                return size
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

    def _copy(self, answer: requests.Response, out, deadline: float) -> int:
        """The answer's bytes into ``out`` as they come (each read returns what one receive gave,
        so a server that trickles is stopped at the deadline); how many."""
        size = 0
        while True:
            if self._clock() > deadline:
                raise _Miss("over_time", f"more than {self.fetch_timeout_s} s")
            chunk = answer.raw.read1(_CHUNK, decode_content=False)
            if not chunk:
                return size
            size += len(chunk)
            if size > self.max_file_bytes:
                raise _Miss("too_large", f"more than {self.max_file_bytes} bytes")
            out.write(chunk)


def _check(stream, build_id: str, machine: str) -> None:
    """Raise _Miss unless ``stream`` holds an ELF file of ``machine`` whose build id is ``build_id``."""
    try:
        elf = BoundedElf(stream)
        found_machine, found_id = elf["e_machine"], elf_build_id(elf)
    except Exception as error:  # noqa: BLE001 - the answer is anything a server sent
        raise _Miss("rejected_not_elf", str(error)) from None
    if found_machine != machine:
        raise _Miss("rejected_other_machine", f"{found_machine}, not {machine}")
    if found_id != build_id:
        raise _Miss("rejected_other_build_id", f"{found_id}, not {build_id}")
