"""The analyses over aligned ranks: overlap, stragglers and their what-if, the diagnosis, memory, hangs."""
