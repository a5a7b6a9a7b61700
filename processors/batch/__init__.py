"""The batch processor: merges messages into batches sent by size or after a timeout.

Modules: `config` (keys and defaults, as Go's), `pending` (what is held per signal),
`processor` (triggers and the timer thread), `telemetry` (the Go `otelcol_processor_batch_*` metrics).
"""
