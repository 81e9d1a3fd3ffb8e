"""Maintained measurement tools, run from the repository root (`python benchmarks/NAME.py ...` or
`python -m benchmarks.NAME ...`); each has a smoke test in tests/test_benchmarks.py."""
