"""Benchmarks: python -m bench.run (make bench); results in bench/results/, the report in bench/REPORT.md."""
