"""Compare two runs: what got slower, where, and whether it is beyond run-to-run noise
(`python -m harness.compare BASE NEW`, docs/compare.md)."""
