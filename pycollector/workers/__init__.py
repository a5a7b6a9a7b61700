"""A collector that uses every core: its pipelines run in several worker processes.

Python runs one thread at a time per process, so one process decodes, processes and encodes on
one core. ``service::workers`` (default ``auto``: one per usable core for a config whose receivers
can share their ports, one otherwise) starts that many workers, each a whole collector of the same
config (``worker``), under a supervisor (``supervisor``) that replaces a worker that dies and is
what the outside sees: one health answer, one metrics page (``merge``). The workers listen on the
same ports with SO_REUSEPORT, so the kernel spreads connections over them and no data passes
through the supervisor.

What must have one owner says how: health_check runs in the supervisor, pprof in worker 0, a
file_storage directory is split per worker, memory_limiter's limits are split between workers
(``Factory.placement``, ``Settings.worker``).
"""
