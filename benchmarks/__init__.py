"""Benchmark harness: ``.venv/bin/python -m benchmarks [--quick] [--messages N ...]``.

Prints figures and writes ``benchmarks/results/latest.{json,md,png}``; it is
a command, not a test (timings on a shared machine are not pass/fail facts).
"""
