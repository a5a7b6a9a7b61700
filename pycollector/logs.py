"""Logging setup: structlog, console for people, JSON for machines.

Every component gets a logger bound to its place in the config (``component=exporters::debug``),
so a message can be traced back to the YAML that caused it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, TextIO

import structlog

from pycollector.text import printable

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR}


_format = "console"


def current_format() -> str:
    """``console`` or ``json``: output meant for people can choose how to be laid out."""
    return _format


_stderr_copy: TextIO | None = None


def _log_stream() -> TextIO:
    """Standard error through a descriptor of its own. While BCC compiles, the profiling receiver
    redirects descriptor 2 to capture clang's messages; logs of other threads must not vanish
    into that capture."""
    global _stderr_copy
    if _stderr_copy is None:
        try:
            _stderr_copy = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
        except (AttributeError, OSError, ValueError):  # no real descriptor (e.g. captured in tests)
            return sys.stderr
    return _stderr_copy


def configure(log_format: str = "console", level: str = "info", stream: TextIO | None = None, process_fields: dict | None = None) -> None:
    """Configure structlog once for the process. ``log_format`` is ``console`` or ``json``;
    ``process_fields`` go on every line this process logs (a worker's ``worker=1``)."""
    global _format
    _format = log_format
    stream = stream or _log_stream()
    shared = [
        *([_adding(process_fields)] if process_fields else []),
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if log_format == "json":
        renderer: Any = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty(), sort_keys=False)
        shared.append(_printable_values)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level.lower()]),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries that log through the standard library (stevedore, grpc) go to the same stream.
    logging.basicConfig(level=max(LEVELS[level.lower()], logging.WARNING), stream=stream, format="%(levelname)s %(name)s: %(message)s")


def _adding(fields: dict):
    def add(_logger: Any, _method: str, event: dict) -> dict:
        for key, value in fields.items():
            event.setdefault(key, value)
        return event

    return add


def _printable_values(_logger: Any, _method: str, event: dict) -> dict:
    """On the console, a logged value (a path, a process name) cannot carry a terminal escape
    sequence; JSON output escapes them already."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = printable(value, keep_lines=key == "exception")
    return event


def get_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger().bind(**bound)


_said: set[tuple[Any, ...]] = set()
_said_lock = threading.Lock()


def log_once(logger: Any, key: tuple[Any, ...], level: str, event: str, /, **fields: Any) -> None:
    """Log ``event`` the first time ``key`` is seen in this process (deprecations, not-implemented keys)."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    getattr(logger, level)(event, **fields)
