"""What an OpenTelemetry SDK inside a sampled process tells out-of-process readers: its resource
(the process context, OTEP 4719) and the span each thread runs in (the thread context, OTEP 4947)."""
