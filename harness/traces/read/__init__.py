"""Reading: the trace files of a run and each rank's trace into a `RankTrace` (see docs/architecture.md)."""
