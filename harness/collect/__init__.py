"""The collector: from a folder (or several) of per-rank traces to a straggler/overlap report.

Stages, one module each, data flowing one way: discover -> parse (per rank, in parallel; each
step's compute folded into its cover) -> align clocks / match collectives -> overlap ->
stragglers -> report. Analyses are pure functions
over `model.RankTrace`; nothing here imports torch.
"""
