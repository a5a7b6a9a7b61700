"""The pprof extension: the Go collector's ``pprof`` (``endpoint``, default ``localhost:1777``),
serving profiles of the collector's own process under ``/debug/pprof/`` so that ``go tool pprof
http://localhost:1777/debug/pprof/profile?seconds=30`` profiles the profiler.

``config`` the keys; ``sampler`` samples the Python threads' stacks, weighted by the CPU time each
thread used; ``profiles`` turns samples into OTLP profiles and those into pprof files through the
pprof exporter's converter; ``extension`` the HTTP paths and ``save_to_file``.
"""
