"""Memory profiles through OpenTelemetry's USDT contract (issue 39): which processes have the
memory programs attached to their otel_memory probes (attach.py), what each probe's arguments are
(probes.py), and the live heap read at each report (live.py). The kernel side is bpf/memory.bpf.c.
"""
