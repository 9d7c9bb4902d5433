"""Benchmarks: each figure is a ratio to a baseline measured in the same run.

Results and how to read them: docs/benchmarks.md.
"""
