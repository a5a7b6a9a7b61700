"""The otlp receiver: OTLP over gRPC and HTTP (protobuf or JSON) for profiles, traces, metrics
and logs.

Modules: `config` (the Go receiver's keys), `receiver` (starts the servers for the signals some
pipeline takes), `grpc_server`, `http_server` with `http_body` (reading, limits, decompression),
and `delivery` (a request's outcome downstream, as a gRPC code and an HTTP status).
"""
