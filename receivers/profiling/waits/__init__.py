"""Waits told apart: which lock a thread waited for (lock_kinds), from its stack; which device an I/O
wait was on (devices), from the number the kernel read."""
