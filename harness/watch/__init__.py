"""The live straggler watch: every N steps the ranks exchange their phase times in one
all-gather (exchange.py) and apply the collector's straggler rule to them (rule.py, pure),
with each rank's arrivals at the collectives that held it (arrivals.py). harness.Run starts it;
it reads the run library's settings, clocks, metrics and profiler (harness/run/)."""
