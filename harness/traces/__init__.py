"""The collector's library: per-rank traces (or in-job summaries) in, typed analyses out.

Stages, one module each, data flowing one way: read (discover -> parse, per rank; each step's
compute folded into its cover) -> align (match collectives, clock offsets, waits) -> analyse
(stragglers, overlap, advisor, memory, hangs); run_analysis.py runs them over one run. Analyses
are pure functions over `model.RankTrace`; nothing here imports torch, report/ or collect/.
"""
