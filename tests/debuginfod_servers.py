"""Servers the debuginfod tests fetch from, on loopback: elfutils' own ``debuginfod`` over a
directory the test fills, and servers that misbehave (answers without end, answers of other
files, sockets that accept and never answer)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Debuginfod:
    """elfutils' server (Debian's ``debuginfod``) over ``directory``'s ELF and debug files."""

    def __init__(self, directory: Path, *, serving: list[str]) -> None:
        """Started, and waited for until it serves the debug file of each build id ``serving``."""
        if shutil.which("debuginfod") is None:
            pytest.fail("Debian's debuginfod is the server here: scripts/setup.sh installs it")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory.parent / f"debuginfod-{self.port}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(["debuginfod", "-F", str(directory), "-p", str(self.port), "-d", ":memory:"],
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        for build_id in serving:
            while not self.serves(build_id):
                assert self.process.poll() is None, self.log.read_text()[-2000:]
                assert time.monotonic() < deadline, f"debuginfod did not index {build_id}: {self.log.read_text()[-2000:]}"
                time.sleep(0.1)

    def serves(self, build_id: str) -> bool:
        try:
            with requests.get(f"{self.url}/buildid/{build_id}/debuginfo", timeout=5, stream=True) as answer:  # (it serves GET alone)
                return answer.status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class Misbehaving:
    """A server on loopback that answers every connection with ``answer(server, connection,
    request)`` on a thread
    of its own: whatever it sends, however long it takes. ``sent`` counts the bytes it got out."""

    def __init__(self, answer) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.answer = answer
        self.connections = 0
        self.sent = 0
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            self.answer(self, connection, connection.recv(65536))
        except OSError:
            pass

    def send(self, connection: socket.socket, data: bytes) -> None:
        connection.sendall(data)
        self.sent += len(data)

    def stop(self) -> None:
        self.listener.close()
        for connection in self._open:
            connection.close()


def endless(server: Misbehaving, connection: socket.socket, request: bytes) -> None:
    """200, no length, and zeros until the client goes: 4 GiB and more."""
    server.send(connection, b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
    block = bytes(1 << 16)
    for _ in range((4 << 30) // len(block) + 1):
        server.send(connection, block)


def said_four_gib(server: Misbehaving, connection: socket.socket, request: bytes) -> None:
    """200 with a Content-Length of 4 GiB, then zeros until the client goes."""
    server.send(connection, b"HTTP/1.1 200 OK\r\nContent-Length: 4294967296\r\n\r\n")
    block = bytes(1 << 16)
    for _ in range((4 << 30) // len(block)):
        server.send(connection, block)


def silent(server: Misbehaving, connection: socket.socket, request: bytes) -> None:
    """Accepts, reads the request, and never answers."""
    time.sleep(3600)


def serving(content: bytes):
    """An answer of ``content`` to every request, as a debuginfod server gives a file."""
    def answer(server: Misbehaving, connection: socket.socket, request: bytes) -> None:
        server.send(connection, b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    + f"Content-Length: {len(content)}\r\nConnection: close\r\n\r\n".encode() + content)
        connection.close()
    return answer


def relayed_after(seconds: float, upstream: str, build_id: str):
    """The answer of the server at ``upstream`` (its port on loopback), ``seconds`` late for a
    request of ``build_id``'s file: a slow network in front of a real server."""
    port = int(upstream.rsplit(":", 1)[1])

    def answer(server: Misbehaving, connection: socket.socket, request: bytes) -> None:
        if build_id.encode() in request:
            time.sleep(seconds)
        with socket.create_connection(("127.0.0.1", port)) as relay:
            relay.sendall(request.replace(b"Connection: keep-alive", b"Connection: close"))
            while True:
                data = relay.recv(65536)
                if not data:
                    break
                server.send(connection, data)
        connection.close()
    return answer
