"""Threads and goroutines: how many of each process sit in each stack at a report (issue 44)."""
