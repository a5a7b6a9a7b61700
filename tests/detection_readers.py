"""Readers for tests/test_runtime_detection.py, imported by symbols/detection.py's helper
process by name (as the runtimes' own readers are)."""

import os
import time


def blocks(path, fd, open_debug):
    """A parse that does not end: the helper must be killed past its deadline."""
    time.sleep(3600)


def size_of(path, fd, open_debug):
    """What the helper was sent: the file's size, read from the descriptor."""
    return os.fstat(fd).st_size
