# The two commands a new user needs: `make demo` (set-up + the main job) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
NPROC ?= 2
# The tests run on two pytest-xdist workers, a test file's tests on one (tests/conftest.py);
# PARALLEL= runs them in one process. Then the torchrun jobs whose tests read a CPU run's timing
# (the `timing` marker: who is late, a watch flag, a compare gate, two runs compared) run one at
# a time, alone: beside other work their verdicts move (bench/RESULTS.md, "The test suite").
# Exit 5 is pytest's "no test selected", which a -k selection may leave one tier with.
PARALLEL ?= -n 2 --dist loadgroup
PYTEST := $(BIN)/python -m pytest -q
DEMO_RUN := demo-$(shell date +%Y%m%d-%H%M%S)
# A 2-rank torch-mode DDP run with rank 1 made slow in its data phase, then the collector.
DEMO_ARGS ?= --mode torch --parallel ddp --steps 20 --warmup-steps 5 --active 6 \
	--slow-rank 1 --slow-ms 30 --slow-phase data

.PHONY: setup test-tools demo test test-quick sanitize selfcheck tensorboard clean-logs

setup:
	VENV=$(VENV) bash launch/setup.sh

# Debian's chromium + chromium-driver (the real-browser test of the TensorBoard view) and tmux
# (the console read in a 100-column terminal).
test-tools:
	bash launch/install_test_tools.sh

demo: setup
	$(BIN)/torchrun --standalone --nproc_per_node $(NPROC) -m harness.train $(DEMO_ARGS) --run-name $(DEMO_RUN)
	$(BIN)/python -m harness.collect profiler_logs/$(DEMO_RUN)

# The tests run the Hugging Face and Lightning callbacks, and their trackers, too: their extras are installed.
test: export EXTRAS := test,hf,lightning,trackers,notebook,debug,gpu
test: setup test-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(PYTEST) $(PARALLEL) -m "not (slow and timing)" --durations=10 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PYTEST) -m "slow and timing" --durations=10 $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The edit loop: every test that starts no torchrun job (the `slow` marker).
test-quick: export EXTRAS := test,hf,lightning,trackers,notebook,debug,gpu
test-quick: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(PYTEST) $(PARALLEL) -m "not slow" $(PYTEST_ARGS)

# The collector's C code under AddressSanitizer and UBSan: its tests, then FUZZ_SECONDS (60) of fuzzing.
sanitize: setup
	VENV=$(VENV) bash launch/sanitize.sh

# Does the profiler see what it should on this machine? The CPU checks, and the GPU ones where CUDA is.
selfcheck: setup
	$(BIN)/python -m harness.selfcheck

tensorboard: setup
	$(BIN)/tensorboard --logdir profiler_logs --host 127.0.0.1

clean-logs:
	find profiler_logs -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
