"""Headless Chromium used as a person uses a page: over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: requests on the browser's fd 3, answers and events on its fd 4, each
message JSON ending in a NUL byte), so a test can drag, click and type, then read what the page
shows and save a screenshot. (``--dump-dom`` loads a page and prints it; nothing can act on it.)"""

from __future__ import annotations

import base64
import fcntl
import itertools
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
ANSWER_S = 30.0


class PageError(AssertionError):
    """The page logged an error or threw."""


class BrowserGone(RuntimeError):
    """Chromium exited (its pipe closed)."""


# Starts of Chromium that exit before their first answer, tried before giving up: once in a CI run,
# one exited at once, before it made its profile directory (its output was not kept then; it is now).
STARTS = 3


class Browser:
    def __init__(self, chromium: str, work: Path, width: int = 1400, height: int = 900):
        self.width, self.height = width, height
        for attempt in range(1, STARTS + 1):
            self._start(chromium, work, width, height)
            try:
                target = self.call("Target.createTarget", url="about:blank")["targetId"]
                break
            except (BrokenPipeError, BrowserGone):
                code, said = self._ended()
                message = f"Chromium exited at its start (exit {code}, start {attempt} of {STARTS}); it said: {said}"
                if attempt == STARTS:
                    raise BrowserGone(message) from None
                print(message)  # (kept by pytest with the test's output)
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _start(self, chromium: str, work: Path, width: int, height: int) -> None:
        """Chromium with the protocol's pipe on its fds 3 and 4. Its fds are put there by bash's
        redirections, not by a preexec_fn (Python code run between fork and exec, which a
        process with threads must not do)."""
        to_browser_read, to_browser = os.pipe()
        from_browser, from_browser_write = os.pipe()
        # Out of the way of 3 and 4, which the redirections make the browser's copies.
        ends = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_read, from_browser_write))
        for fd in (to_browser_read, from_browser_write):
            os.close(fd)
        profile = work / f"chromium-{time.monotonic_ns()}"
        self.log_path = profile.with_suffix(".log")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", 'exec "$0" "${@:3}" 3<&"$1" 4>&"$2"', chromium, *map(str, ends), *FLAGS, "--remote-debugging-pipe",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}"],
                pass_fds=ends, stdout=subprocess.DEVNULL, stderr=log)
        for fd in ends:
            os.close(fd)
        self._out = os.fdopen(to_browser, "wb", buffering=0)
        self._in = os.fdopen(from_browser, "rb", buffering=0)
        self._ids = itertools.count(1)
        self._answers: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.events: queue.Queue = queue.Queue()
        self.errors: list[str] = []  # console errors and uncaught exceptions, as the page met them
        self._gone = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _ended(self) -> tuple[int | None, str]:
        """A Chromium that closed its pipe: its exit status and the end of what it said."""
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        for stream in (self._out, self._in):
            try:
                stream.close()
            except OSError:
                pass
        return code, self.log_path.read_text(errors="replace")[-2000:]

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                chunk = self._in.read(65536)
            except (OSError, ValueError):  # (closed by _ended)
                chunk = b""
            if not chunk:  # Chromium is gone: no answer will come
                with self._lock:
                    waiting, self._answers = list(self._answers.values()), {}
                    self._gone = True
                for answer in waiting:
                    answer.put(None)
                return
            pending += chunk
            *messages, pending = pending.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        answer = self._answers.pop(message["id"], None)
                    if answer is not None:
                        answer.put(message)
                    continue
                method, params = message.get("method"), message.get("params", {})
                if method == "Runtime.exceptionThrown":
                    details = params.get("exceptionDetails", {})
                    self.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                    self.errors.append(" ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", [])))
                self.events.put(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict:
        number = next(self._ids)
        answer: queue.Queue = queue.Queue()
        with self._lock:
            if self._gone:
                raise BrowserGone(f"{method}: Chromium has exited")
            self._answers[number] = answer
        message = {"id": number, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self._out.write(json.dumps(message).encode() + b"\0")
        try:
            reply = answer.get(timeout=ANSWER_S)
        except queue.Empty:
            raise TimeoutError(f"{method}: no answer from the browser in {ANSWER_S} s") from None
        if reply is None:
            raise BrowserGone(f"{method}: Chromium exited before it answered")
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open(self, url: str) -> None:
        """Load ``url`` and wait until it has loaded and drawn (transitions included)."""
        for address in ("about:blank", url):  # (from the same page, a new fragment alone loads nothing)
            while not self.events.empty():
                self.events.get_nowait()
            self.call("Page.navigate", session=True, url=address)
            deadline = time.monotonic() + ANSWER_S
            while True:
                event = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
                if event.get("method") == "Page.loadEventFired":
                    break
        self.settle()

    def settle(self, seconds: float = 0.6) -> None:
        """Let the page's transitions (d3-flame-graph's: 250 ms) finish."""
        self.evaluate(f"new Promise((done) => requestAnimationFrame(() => setTimeout(done, {int(seconds * 1000)})))")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise PageError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def box(self, selector: str) -> dict:
        """The element's box in the viewport: x, y, width, height."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                            " return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")
        assert box is not None, selector
        return box

    def drag(self, start: tuple[float, float], end: tuple[float, float], steps: int = 8) -> None:
        """Press the left button at ``start``, move to ``end`` and release, as a hand would."""
        mouse = lambda kind, x, y, buttons: self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y,  # noqa: E731
                                                      button="left", buttons=buttons, clickCount=1)
        mouse("mouseMoved", *start, 0)
        mouse("mousePressed", *start, 1)
        for step in range(1, steps + 1):
            mouse("mouseMoved", start[0] + (end[0] - start[0]) * step / steps, start[1] + (end[1] - start[1]) * step / steps, 1)
        mouse("mouseReleased", *end, 0)
        self.settle()

    def click(self, selector: str) -> None:
        box = self.box(selector)
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        for kind, buttons in (("mousePressed", 1), ("mouseReleased", 0)):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", buttons=buttons, clickCount=1)
        self.settle()

    def screenshot(self, path: Path) -> Path:
        """The whole page as a person sees it, saved as a PNG."""
        height = self.evaluate("document.documentElement.scrollHeight")
        shot = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": self.width, "height": max(self.height, height), "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:  # noqa: BLE001 - gone already
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._out.close()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
