"""Names of JIT-compiled code: perf maps (perfmap.py), asked of JVMs through HotSpot's attach socket
(jvm_attach.py, jvm_perfmap.py); names.py decides which processes' JIT frames are named.
"""
