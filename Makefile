# Everything installs into ./.venv; torch is constrained to its CPU build (constraints/cpu.txt).
# On a CUDA machine install by hand instead: pip install -e '.[verifier]'
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: gpu-check demo test test-fast lint bench clean

# What the demo needs (kernelflow and the verifier's torch and Triton), then the rest for
# the tests, lint and benches (verl, the dashboard, the report's plots, observability).
$(BIN)/.demo-installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints/cpu.txt -e '.[verifier]'
	touch $@

$(BIN)/.installed: $(BIN)/.demo-installed
	$(BIN)/pip install --quiet -c constraints/cpu.txt -e '.[verifier,test,verl,report,observability,ui]'
	$(BIN)/pip install --quiet -c constraints/cpu.txt --no-deps verl==0.9.1
	touch $@

# The main job: one example task end to end on the embedded NATS, no API key needed.
demo: $(BIN)/.demo-installed
	$(BIN)/kernelflow run examples/tasks/relu.py --llm scripted:examples/scripted/relu.yaml

# Three test processes on a 2-core machine: enough to keep both cores busy while some
# tests wait on servers and subprocesses (six took as long as three: the suite is bound
# by CPU, mostly the verifier's start-up in each daemon), and no test keeps a timing
# margin that this load can eat (README, Development). A module's tests stay together,
# in order, with their module-wide servers and daemons.
#
# A machine whose Python writes no bytecode (PYTHONDONTWRITEBYTECODE, as this project's
# machines set it) would compile kernelflow's sources again in each of the thousands of
# processes the tests start (the CLI, daemons, verifier sandboxes): they are compiled once
# first (compileall writes whatever that variable says; a source newer than its bytecode
# is compiled again as usual).
test: $(BIN)/.installed
	$(BIN)/python -m compileall -q $(LAYERS) kernelflow tests
	$(BIN)/python -m pytest -q -n 3 --dist loadfile

# The inner loop: tests/unit, which starts no process and opens no connection
# (tests/tiers.py fails a test there that does).
test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 tests/unit

# mypy cannot follow the editable install's import hook, so it checks the package through a
# tree of links laid out as the wheel installs it (kernelflow/events -> events/, ...).
TYPECHECK := build/typecheck
# The top-level folders that install as kernelflow.<folder> (pyproject's package-dir).
LAYERS := common events sandbox verification llm tools actors telemetry projections workflows
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/kernelflow
	ln -s $(filter-out %/__pycache__,$(wildcard $(CURDIR)/kernelflow/*)) $(TYPECHECK)/kernelflow/
	for layer in $(LAYERS); do ln -s $(CURDIR)/$$layer $(TYPECHECK)/kernelflow/$$layer; done
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy -p kernelflow
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy --strict -p kernelflow.common -p kernelflow.events -p kernelflow.projections -p kernelflow.workflows

bench: $(BIN)/.installed
	$(BIN)/python bench/append_throughput.py
	$(BIN)/python bench/conductor_overhead.py
	$(BIN)/python bench/verify_speed.py
	$(BIN)/python bench/llm_gateway.py
	$(BIN)/python bench/readmodel_save.py
	$(BIN)/python bench/cpp_verify_speed.py
	$(BIN)/python bench/agentic_rollout_overhead.py
	$(BIN)/python bench/cli_start.py
	$(BIN)/python bench/speed_of_light.py

# On a CUDA machine (install with '.[verifier,cupy]' and the corpus fetched, see
# bench/corpus/fetch.py): the GPU acceptance run, then the full verifier on corpus kernels.
gpu-check:
	$(BIN)/python bench/gpu_check.py
	$(BIN)/python bench/verifier_precision.py --corpus .corpus --run 24

clean:
	rm -rf $(VENV) build kernelflow-runs .pytest_cache
