"""CPython frames for the profiling receiver: finding the interpreter and its offsets
(detect.py, offsets.py), reading another process's memory (memory.py), and turning a code object
and instruction into function, file and line (code.py, linetable.py)."""
