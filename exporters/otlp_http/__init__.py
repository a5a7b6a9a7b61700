"""The otlp_http exporter (alias ``otlphttp``): OTLP over HTTP, protobuf or JSON, with the Go
exporter's keys, per-signal URLs, sending queue and retry."""
