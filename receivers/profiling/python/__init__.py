"""CPython frames for the profiling receiver: finding the interpreter and its offsets
(detect.py, offsets.py), reading another process's memory (memory.py), turning a code object and
instruction into function, file and line (code.py, linetable.py), and the kernel walker's path
done in Python as its reference (walk.py)."""
