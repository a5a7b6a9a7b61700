"""HotSpot's Java frames without perf maps: the JVM's own description of its structures
(vmstructs.py), and what the kernel's walker and the report need from it."""
