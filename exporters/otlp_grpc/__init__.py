"""The otlp_grpc exporter (alias ``otlp``): OTLP over gRPC to a collector or backend, with the
Go exporter's keys, sending queue and retry."""
