"""Benchmarks of pycollector against the tools a user would pick instead (issue 8).

`make bench` (``python -m bench``) runs every scenario, alternating pycollector with its peers in
one run, and writes bench/RESULTS.md. Each figure is a ratio to a peer measured in the same run.
"""
