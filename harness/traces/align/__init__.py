"""Across ranks: which ops are one collective, the clocks' offsets, and each collective's waits."""
