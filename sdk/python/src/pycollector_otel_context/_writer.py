"""Keeps each thread's record (the native otel_thread_ctx_v1) on the span that thread runs in.

A thread changes span in three ways, each followed here:
- the OpenTelemetry context is attached or detached (``start_as_current_span``, ``use_span``,
  instrumentations): the runtime context (runtime.py) calls `Writer.record` after each;
- an asyncio event loop switches task: each task runs in its own contextvars context, with no
  attach in between, so the loop's callbacks (``asyncio.events.Handle._run``, through which every
  task step passes) record the span of the context they run in, and the loop's own after;
- an attribute the key map names is set on the running span (``http.route`` is set after the
  server span starts): ``Span.set_attribute(s)`` of the SDK records it again.

The process context (the resource, and the key map that names the record's attributes) is
published when the runtime context is made (from the environment's resource), and again at the
first record once the tracer provider has its resource, and whenever that changes.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable, Optional
from urllib.parse import unquote

from typing import TYPE_CHECKING

from . import _native
from ._resource import encode_resource

if TYPE_CHECKING:
    from opentelemetry.context.context import Context

SCHEMA_VERSION = "tlsdesc_v1_dev"  # threadlocal.schema_version: the record layout of OTEP 4947
ATTRIBUTES_ENV = "PYCOLLECTOR_CONTEXT_ATTRIBUTES"  # span attributes a record carries, comma-separated
DEFAULT_ATTRIBUTE_KEYS = ("http.route",)
MAX_KEYS = 256  # a record names its attribute by a one-byte index into the key map
MAX_VALUE_BYTES = 255  # and gives its length in one byte


def attribute_keys_from_env() -> tuple:
    configured = os.environ.get(ATTRIBUTES_ENV)
    if configured is None:
        return DEFAULT_ATTRIBUTE_KEYS
    return tuple(key.strip() for key in configured.split(",") if key.strip())


_FROM_ENVIRONMENT = object()  # what was published: the environment's resource, no provider's yet


def resource_from_environment() -> dict:
    """The resource attributes the SDK's environment variables give (the SDK adds its own at
    the first span)."""
    attributes = {}
    for pair in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            attributes[unquote(key.strip())] = unquote(value.strip())
    service = os.environ.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attributes["service.name"] = service
    return attributes


trace: Any = None  # opentelemetry.trace, imported at the first record: it imports opentelemetry.context,
# which loads the runtime context (runtime.py, this module) while it is itself half imported


class Writer:
    def __init__(self, attribute_keys: Iterable[str]) -> None:
        self.keys = tuple(dict.fromkeys(attribute_keys))[:MAX_KEYS]
        self._index = {key: index for index, key in enumerate(self.keys)}
        self._thread = threading.local()  # .span: the span this thread's record holds
        self._published: Any = None  # the resource last published (the provider's object)
        self._publish_lock = threading.Lock()
        self._hooks_lock = threading.Lock()
        self._hooked = False
        self.errors = 0
        if hasattr(os, "register_at_fork"):  # the region is not inherited (MADV_DONTFORK)
            os.register_at_fork(after_in_child=self._forget_publication)

    def record(self, context: Optional["Context"], *, force: bool = False) -> None:
        """This thread now runs in ``context``'s span (or none). Never raises into the caller's
        code (an attach, an event loop's callback): a failure is counted in ``errors`` and the
        record cleared."""
        try:
            self._record(context, force)
        except Exception:  # noqa: BLE001 - the application runs on; its profile loses a link
            self.errors += 1
            try:
                _native.clear_span()
                self._thread.span = None
            except Exception:  # noqa: BLE001
                pass

    def _record(self, context: Optional["Context"], force: bool) -> None:
        local = self._thread
        if context is getattr(local, "context", None) and not force:
            return  # (contexts are immutable: the same one, the same span; an event loop's turns)
        local.context = context
        global trace
        if trace is None:
            from opentelemetry import trace
        span = trace.get_current_span(context) if context is not None else None
        if span is trace.INVALID_SPAN:
            span = None  # (what get_current_span gives a context without a span)
        if span is getattr(local, "span", None) and not force:
            return  # (the same span attached again)
        local.span = None  # (until written: a failure leaves the record cleared, and says so)
        self._write(span, local, force)
        local.span = span

    def _write(self, span: Optional[Any], local: threading.local, force: bool) -> None:
        if span is None:
            _native.clear_span()
            return
        encoded = getattr(local, "encoded", None)  # (span, set_span's arguments): a task's span again
        if force or encoded is None or encoded[0] is not span:
            if not self._hooked:
                self._install_hooks()
            self._publish_if_changed()
            span_context = span.get_span_context()
            if not span_context.is_valid:
                _native.clear_span()
                return
            encoded = local.encoded = (span, (span_context.trace_id.to_bytes(16, "big"), span_context.span_id.to_bytes(8, "big"),
                                              int(span_context.trace_flags) & 0xFF, self._attributes(span)))
        _native.set_span(*encoded[1])

    def _attributes(self, span: Any) -> bytes:
        attributes = getattr(span, "attributes", None)
        if not attributes or not self.keys:
            return b""
        out = bytearray()
        for key, index in self._index.items():
            value = attributes.get(key)
            if value is None:
                continue
            data = str(value).encode("utf-8", "replace")[:MAX_VALUE_BYTES]
            if len(out) + 2 + len(data) > _native.ATTRS_CAPACITY:
                break  # (the record is full: the keys first in the map are kept)
            out += bytes((index, len(data))) + data
        return bytes(out)

    # --------------------------------------------------------------------- the process context

    def start(self, current_context) -> None:
        """When the runtime context is made: follow asyncio and thread pools, publish the
        process context. Never raises: the application's OpenTelemetry must work without us."""
        try:
            self.hook_asyncio(current_context)
            self.hook_thread_pools(current_context)
            self.publish_from_environment()
        except Exception:  # noqa: BLE001 - a refused mmap, a resource over 64 KiB...
            self.errors += 1

    def publish_from_environment(self) -> None:
        """Publish at start-up what the environment says of the resource (OTEL_SERVICE_NAME,
        OTEL_RESOURCE_ATTRIBUTES), so that a profiler finds the process and its variable before
        the first span; the tracer provider's resource replaces it at the first span."""
        with self._publish_lock:
            if self._published is None:
                self.publish(resource_from_environment())
                self._published = _FROM_ENVIRONMENT

    def _publish_if_changed(self) -> None:
        resource = getattr(trace.get_tracer_provider(), "resource", None)
        if self._published is not None and (resource is None or resource is self._published):
            return
        with self._publish_lock:
            if self._published is not None and (resource is None or resource is self._published):
                return
            self.publish(dict(resource.attributes) if resource is not None else resource_from_environment())
            self._published = resource if resource is not None else _FROM_ENVIRONMENT

    def publish(self, resource_attributes: dict) -> int:
        """Publish the process context: these resource attributes, and how to read the records."""
        attributes = {key: value for key, value in resource_attributes.items() if not key.startswith("threadlocal.")}
        attributes["threadlocal.schema_version"] = SCHEMA_VERSION
        attributes["threadlocal.attribute_key_map"] = list(self.keys)
        return _native.publish(encode_resource(attributes))

    def _forget_publication(self) -> None:
        """In a forked child: the parent's region is not mapped here; publish our own now (a
        prefork worker may serve for long before its first new span)."""
        self._published = None
        self._publish_lock = threading.Lock()
        self._hooks_lock = threading.Lock()
        try:
            if trace is not None:
                self._publish_if_changed()
            else:
                self.publish_from_environment()
        except Exception:  # noqa: BLE001
            self.errors += 1

    # --------------------------------------------------------------------- hooks

    def _install_hooks(self) -> None:
        with self._hooks_lock:
            if self._hooked:
                return
            self._hooked = True
            self._hook_set_attributes()

    def _hook_set_attributes(self) -> None:
        try:
            from opentelemetry.sdk.trace import Span
        except ImportError:
            return  # the API alone: no attributes to follow
        writer = self

        def wrap(original):
            def wrapper(span, *args, **kwargs):
                result = original(span, *args, **kwargs)
                if span is getattr(writer._thread, "span", None):  # the running span: its record again
                    writer.record(trace.set_span_in_context(span), force=True)
                return result
            wrapper.__wrapped__ = original
            wrapper.__name__ = original.__name__
            wrapper.__doc__ = original.__doc__
            return wrapper

        if self.keys:
            Span.set_attribute = wrap(Span.set_attribute)
            Span.set_attributes = wrap(Span.set_attributes)

    def hook_thread_pools(self, current_context) -> None:
        """A pool thread runs jobs in contexts copied from their submitters (asyncio.to_thread,
        run_in_executor with a context): the span a job left in the record must not stay there
        while the thread waits for the next one."""
        from concurrent.futures import thread

        original = thread._WorkItem.run
        if getattr(original, "_pycollector_context", False):
            return
        writer = self

        def run(item, *args, **kwargs):
            try:
                return original(item, *args, **kwargs)
            finally:
                writer.record(current_context.get())  # (the pool thread's own context)

        run._pycollector_context = True
        run.__wrapped__ = original
        thread._WorkItem.run = run

    def hook_asyncio(self, current_context) -> None:
        """Record the span of each event loop callback's context (``current_context``: the
        runtime context's ContextVar)."""
        from asyncio import events

        original = events.Handle._run
        if getattr(original, "_pycollector_context", False):
            return
        writer = self

        def _run(handle):
            # The span of the context the callback runs in (the task's), whatever the record held
            # (a task that attached a span in its last step left it there); the loop's own after.
            writer.record(handle._context.get(current_context) if handle._context is not None else None)
            try:
                return original(handle)
            finally:
                writer.record(current_context.get())

        _run._pycollector_context = True
        _run.__wrapped__ = original
        events.Handle._run = _run
