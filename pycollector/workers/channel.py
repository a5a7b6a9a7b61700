"""The supervisor's line to one worker: a socketpair carrying pickled messages, each a length
and its bytes. Both ends are this collector's own processes (the worker is started with its end),
so pickle carries the config and the metric families as they are."""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

_LENGTH = struct.Struct("!I")
MAX_MESSAGE = 256 << 20  # (a config, or every metric family of a worker, is far smaller)


class Channel:
    def __init__(self, sock: socket.socket):
        self.socket = sock
        self._send_lock = threading.Lock()

    @classmethod
    def from_fd(cls, fd: int) -> "Channel":
        return cls(socket.socket(fileno=fd))

    def send(self, message: Any) -> bool:
        """False when the other end is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self.socket.sendall(_LENGTH.pack(len(data)) + data)
        except OSError:
            return False
        return True

    def receive(self) -> Any | None:
        """The next message; None when the other end closed (or died)."""
        header = self._read(_LENGTH.size)
        if header is None:
            return None
        (length,) = _LENGTH.unpack(header)
        if length > MAX_MESSAGE:
            raise ValueError(f"a message of {length} bytes on the worker channel")
        data = self._read(length)
        return None if data is None else pickle.loads(data)

    def _read(self, size: int) -> bytes | None:
        parts, left = [], size
        while left:
            try:
                part = self.socket.recv(min(left, 1 << 20))
            except OSError:
                return None
            if not part:
                return None
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.socket.close()
