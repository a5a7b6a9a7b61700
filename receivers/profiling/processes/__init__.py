"""Sampled processes: what /proc says (proc.py), the table that owns each process's life and tells
the other rooms of it (table.py), the one place a process's files are opened (files.py), and
targeting (targeting.py). Imports nothing else of the receiver.
"""
