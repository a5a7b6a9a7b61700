"""A small HTTP service instrumented with the OpenTelemetry Python SDK, as a user writes one: a
server span per request, spans exported over OTLP/HTTP in batches. Run it with the writer on
(OTEL_PYTHON_CONTEXT=pycollector_thread_context) and its profiles link to its spans (the README's
worked example; tests/test_python_spans.py runs it under load).

    python service.py [OTLP_TRACES_URL]      (default http://127.0.0.1:4318/v1/traces)

It prints the port it listens on (127.0.0.1; PORT in the environment chooses it, else any free one). Routes: /checkout burns CPU in checkout_total
(three times the work of /browse's browse_catalog), /slow sleeps in wait_for_inventory,
/flush exports the spans ended so far. Each answer carries X-Cpu-Seconds: the CPU time the
handler's thread spent in the span.
"""

import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "shop", "service.version": "2.1.0"}))
TRACES_URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:4318/v1/traces"
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=TRACES_URL, timeout=5), schedule_delay_millis=500))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")

UNIT = 200_000


def burn(rounds: int) -> int:
    total = 0
    for i in range(rounds):
        total = (total * 31 + i) & 0xFFFFFFFF
    return total


def checkout_total() -> int:
    return burn(3 * UNIT)


def browse_catalog() -> int:
    return burn(UNIT)


def wait_for_inventory() -> None:
    time.sleep(0.05)


HANDLERS = {"/checkout": checkout_total, "/browse": browse_catalog, "/slow": wait_for_inventory}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/flush":
            provider.force_flush()
            return self.answer(0.0)
        handler = HANDLERS.get(self.path)
        if handler is None:
            self.send_error(404)
            return
        with tracer.start_as_current_span("GET " + self.path, kind=trace.SpanKind.SERVER, attributes={"http.request.method": "GET"}) as span:
            span.set_attribute("http.route", self.path)  # (as frameworks do: the route is known once routed)
            start = time.thread_time()
            handler()
            cpu = time.thread_time() - start
        self.answer(cpu)

    def answer(self, cpu: float) -> None:
        self.send_response(200)
        self.send_header("X-Cpu-Seconds", repr(cpu))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "0"))), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
