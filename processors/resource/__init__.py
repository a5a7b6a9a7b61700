"""The resource processor: insert, update, upsert, delete, hash, extract or convert resource
attributes (e.g. set `service.name` from `process.executable.name`, as Pyroscope groups by it)."""
