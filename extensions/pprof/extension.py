"""The pprof extension's runtime: Go's ``net/http/pprof`` paths under ``/debug/pprof/`` for this
process, and ``save_to_file``.

- ``profile?seconds=N``: a CPU profile of the Python threads over N seconds (default 30, at most
  ``MAX_SECONDS``), gzipped pprof, what ``go tool pprof URL`` fetches.
- ``goroutine``: Go's name kept, so the URLs people know work: Python has threads where Go has
  goroutines. ``?debug=2`` dumps every thread's stack as text, ``?debug=1`` groups threads with the
  same stack, no ``debug`` gives a pprof profile counting threads by stack.
- ``cmdline``: the command line, NUL-separated, as Go answers it.
- ``/debug/pprof/``: an index of those. Go's heap, allocs, block, mutex, threadcreate and trace
  profiles have no counterpart here, and like any other path they answer 404.

Several CPU profiles may run at once (Go refuses a second one): they share the sampler.
"""

from __future__ import annotations

import html
import sys
import threading
import time

from pycollector.component import Component, StartError
from pycollector.http_server import HttpEndpoint, Response

from extensions.pprof.config import PprofExtensionConfig
from extensions.pprof.profiles import cpu_profile, stack_dump, threads_profile
from extensions.pprof.sampler import CpuSampler, thread_stacks

PREFIX = "/debug/pprof/"
DEFAULT_SECONDS = 30  # Go's default
MAX_SECONDS = 600
TEXT = "text/plain; charset=utf-8"
PPROF = "application/octet-stream"

DESCRIPTIONS = {
    "cmdline": "The command line of this collector process.",
    "goroutine": "Stack traces of all Python threads (Go's goroutines): debug=2 for each thread's stack, "
                 "debug=1 for threads grouped by stack, no debug for a pprof profile.",
    "profile": f"CPU profile of the Python threads. Give the duration in the seconds GET parameter (default "
               f"{DEFAULT_SECONDS}, at most {MAX_SECONDS}); then run go tool pprof on the file it returns.",
}


class PprofExtension(Component):
    def __init__(self, settings, config: PprofExtensionConfig):
        self.log = settings.logger
        self.config = config
        self.sampler = CpuSampler()
        self._server = HttpEndpoint(config.endpoint, self._answer, thread_name="pprof-http", query=True)
        self._stopping = threading.Event()  # ends CPU profiles in progress at shutdown
        self._whole_run = None  # the save_to_file recording
        self._save_file = None
        self.url: str | None = None

    def start(self, host) -> None:
        if self.config.save_to_file:
            try:
                # Opened now, as Go creates the file at start: a path that cannot be written stops the start.
                self._save_file = open(self.config.save_to_file, "wb")
            except OSError as error:
                raise StartError(f"save_to_file: cannot create {self.config.save_to_file}: {error.strerror or error}") from error
        self.sampler.start()
        try:
            self.url = self._server.start() + PREFIX
        except StartError:
            self._close_save_file()
            self.sampler.close()
            raise
        if self._save_file is not None:
            self._whole_run = self.sampler.begin()
        self.log.info("pprof", url=self.url, save_to_file=self.config.save_to_file or None)

    def shutdown(self) -> None:
        self._stopping.set()
        self._server.stop()
        if self._whole_run is not None:
            self._save(self.sampler.end(self._whole_run))
            self._whole_run = None
        self._close_save_file()
        self.sampler.close()

    def _save(self, recording) -> None:
        try:
            self._save_file.write(cpu_profile(recording, self.sampler.period_ns))
            self._save_file.flush()
        except OSError as error:
            self.log.error("cannot write the CPU profile", save_to_file=self.config.save_to_file, error=error.strerror or str(error))
            return
        self.log.info("wrote the CPU profile of this run", save_to_file=self.config.save_to_file, samples=recording.samples)

    def _close_save_file(self) -> None:
        if self._save_file is not None:
            self._save_file.close()
            self._save_file = None

    # -- HTTP ----------------------------------------------------------------------------------

    def _answer(self, path: str, query: dict[str, str]) -> Response:
        if path in (PREFIX, PREFIX.rstrip("/")):
            return self._index()
        name = path.removeprefix(PREFIX) if path.startswith(PREFIX) else None
        if name == "profile":
            return self._profile(query)
        if name == "goroutine":
            return self._threads(query)
        if name == "cmdline":
            return Response(200, "\0".join(sys.orig_argv).encode(), TEXT)
        return Response(404, (f"Unknown profile: {name}\n" if name else "404 page not found\n").encode(), TEXT)

    def _profile(self, query: dict[str, str]) -> Response:
        seconds = _int(query.get("seconds"))
        if seconds <= 0:  # Go: missing, unreadable or not positive means the default
            seconds = DEFAULT_SECONDS
        if seconds > MAX_SECONDS:
            return Response(400, f"seconds: at most {MAX_SECONDS} (got {seconds})\n".encode(), TEXT)
        recording = self.sampler.begin()
        try:
            self._stopping.wait(seconds)
        finally:
            self.sampler.end(recording)
        return _attachment(cpu_profile(recording, self.sampler.period_ns), "profile")

    def _threads(self, query: dict[str, str]) -> Response:
        debug = _int(query.get("debug"))
        threads = thread_stacks()
        if debug <= 0:
            return _attachment(threads_profile(threads, time.time_ns()), "goroutine")
        return Response(200, stack_dump(threads, grouped=debug == 1).encode(), TEXT)

    def _index(self) -> Response:
        counts = {"goroutine": len(thread_stacks())}
        rows = "".join(
            f"<tr><td>{counts.get(name, '')}</td><td><a href='{name}{'?debug=1' if name == 'goroutine' else ''}'>{name}</a></td></tr>\n"
            for name in sorted(DESCRIPTIONS)
        )
        notes = "".join(f"<li><b>{name}</b>: {html.escape(text)}</li>\n" for name, text in sorted(DESCRIPTIONS.items()))
        body = f"""<html>
<head><title>/debug/pprof/</title></head>
<body>
/debug/pprof/<br>
<p>Profiles of this pycollector process (its Python threads). Set debug=1 for text where the profile has it.</p>
<table><thead><td>Count</td><td>Profile</td></thead>
{rows}</table>
<a href="goroutine?debug=2">full goroutine stack dump</a> (every Python thread)
<br><p>Profile descriptions:</p>
<ul>
{notes}</ul>
<p>Go's heap, allocs, block, mutex, threadcreate and trace profiles have no counterpart in this process.</p>
</body>
</html>
"""
        return Response(200, body.encode(), "text/html; charset=utf-8")


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return 0


def _attachment(payload: bytes, name: str) -> Response:
    return Response(200, payload, PPROF, {"Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff"})
