"""The OpenTelemetry runtime context that also keeps the thread records current.

Selected by one environment variable, before the application starts:

    OTEL_PYTHON_CONTEXT=pycollector_thread_context

(the SDK loads the runtime context named there from the ``opentelemetry_context`` entry points),
or switched on from code with `pycollector_otel_context.enable()`. It is the SDK's contextvars
runtime context, unchanged, plus a record of the span after each attach and detach.
"""

from __future__ import annotations

from contextvars import Token

from opentelemetry.context.context import Context  # (not the package: the SDK loads this while importing it)
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

from ._writer import Writer, attribute_keys_from_env

WRITER = Writer(attribute_keys_from_env())


class ThreadContextRuntimeContext(ContextVarsRuntimeContext):
    def __init__(self) -> None:
        super().__init__()
        WRITER.start(self._current_context)

    @classmethod
    def sharing(cls, runtime: ContextVarsRuntimeContext) -> "ThreadContextRuntimeContext":
        """One that takes over from ``runtime`` (its ContextVar, so that the tokens it gave out
        still detach)."""
        taken_over = cls.__new__(cls)
        taken_over._current_context = runtime._current_context
        WRITER.start(taken_over._current_context)
        return taken_over

    def attach(self, context: Context) -> "Token[Context]":
        token = super().attach(context)
        WRITER.record(context)
        return token

    def detach(self, token: "Token[Context]") -> None:
        super().detach(token)
        WRITER.record(self._current_context.get())
