"""The loadbalancing exporter: each routing key to one of a set of OTLP backends, found by a resolver."""
