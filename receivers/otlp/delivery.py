"""Pushing a decoded request downstream, and what the client is told when that fails.

Both servers answer from the same ``Rejection``: a refusal downstream (backpressure) is gRPC
UNAVAILABLE / HTTP 503, which OTLP clients retry, with the delay the refusal asked for; data a
component can never take is INVALID_ARGUMENT / 400, which they drop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
from google.rpc import status_pb2

from pycollector.client import NO_CLIENT, ClientInfo, client_context
from pycollector.component import Consumer, PermanentError, RefusedError
from pycollector.exporterhelper.failure_log import FailureLog
from pycollector.otlp import status_message
from pycollector.pdata import item_count


@dataclasses.dataclass(frozen=True)
class Rejection:
    grpc_code: grpc.StatusCode
    http_status: int
    message: str
    retry_after: float | None = None

    def status(self) -> status_pb2.Status:
        return status_message(self.grpc_code.value[0], self.message, self.retry_after)


def undecodable(signal: str, error: Exception) -> Rejection:
    return Rejection(grpc.StatusCode.INVALID_ARGUMENT, 400, f"cannot decode the {signal} request: {error}")


class Delivery:
    """Calls the next consumer for both servers; None when the data was taken."""

    def __init__(self, next_consumer: Consumer, logger: Any):
        self.next_consumer = next_consumer
        self._failures = FailureLog(logger)

    def __call__(self, data: Any, client: ClientInfo = NO_CLIENT) -> Rejection | None:
        count = item_count(data)
        if count == 0:
            # As the Go receiver: an empty request is answered, not pushed through the pipeline.
            return None
        try:
            with client_context(client):
                self.next_consumer.consume(data)
        except RefusedError as error:
            return Rejection(grpc.StatusCode.UNAVAILABLE, 503, str(error), error.retry_after)
        except PermanentError as error:
            return Rejection(grpc.StatusCode.INVALID_ARGUMENT, 400, str(error))
        except Exception as error:  # a failing component must not take the server down
            self._failures.record("error", "the pipeline failed on a request", count, error=repr(error))
            return Rejection(grpc.StatusCode.INTERNAL, 500, f"internal error: {error}")
        return None

    def flush(self) -> None:
        self._failures.flush()
