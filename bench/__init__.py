"""Stage 11, benchmarks: run from the repository root as `python -m bench.<name>` (bench/README.md);
results in bench/results/*.json. `bench.common` is their shared machine record and writer.
"""
