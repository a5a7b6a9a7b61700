"""Shares the span each thread runs in with eBPF profilers, as OpenTelemetry specifies it.

With the OpenTelemetry Python SDK, and this package installed, one of:

    OTEL_PYTHON_CONTEXT=pycollector_thread_context      (environment, nothing else to change)
    import pycollector_otel_context; pycollector_otel_context.enable()   (in code, at start-up)

Then the process publishes its resource (OTEP 4719, process context) and each thread's current
trace id, span id and chosen span attributes (OTEP 4947, thread context: the native variable
``otel_thread_ctx_v1``), which a profiler reads at each sample: pycollector's profiling receiver
links every sample to the span it ran in. ``PYCOLLECTOR_CONTEXT_ATTRIBUTES`` (comma-separated,
default ``http.route``) names the span attributes the records carry.
"""

from __future__ import annotations

from ._writer import ATTRIBUTES_ENV, DEFAULT_ATTRIBUTE_KEYS, SCHEMA_VERSION

# (.runtime is imported when needed, not here: with OTEL_PYTHON_CONTEXT set, importing this
# package before OpenTelemetry would have the API load .runtime while this is half imported.)
__all__ = ["enable", "enabled", "ATTRIBUTES_ENV", "DEFAULT_ATTRIBUTE_KEYS", "SCHEMA_VERSION"]


def enable() -> None:
    """Switch it on from code: the SDK's runtime context is taken over (tokens given out before
    stay valid), the process context published now, this thread's record set."""
    import opentelemetry.context as context_api
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    from .runtime import WRITER, ThreadContextRuntimeContext

    context_api.get_current()  # (API releases before 1.25 make the runtime context at its first use)
    runtime = context_api._RUNTIME_CONTEXT
    if not isinstance(runtime, ThreadContextRuntimeContext):
        if not isinstance(runtime, ContextVarsRuntimeContext):
            raise RuntimeError(f"pycollector_otel_context: the runtime context is {type(runtime).__name__}; "
                               "only the SDK's contextvars one can be taken over")
        context_api._RUNTIME_CONTEXT = ThreadContextRuntimeContext.sharing(runtime)
    WRITER.record(context_api.get_current(), force=True)


def enabled() -> bool:
    import opentelemetry.context as context_api

    from .runtime import ThreadContextRuntimeContext

    return isinstance(context_api._RUNTIME_CONTEXT, ThreadContextRuntimeContext)
