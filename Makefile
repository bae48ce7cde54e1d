# Everything installs into ./.venv; torch is constrained to its CPU build (constraints/cpu.txt).
# On a CUDA machine install by hand instead: pip install -e '.[verifier]'
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints/cpu.txt -e '.[verifier,test]'
	touch $@

# The main job: one example task end to end on the embedded NATS, no API key needed.
demo: $(BIN)/.installed
	$(BIN)/kernelflow run examples/tasks/relu.py --llm scripted:examples/scripted/relu.yaml

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy kernelflow events actors projections workflows

bench: $(BIN)/.installed
	$(BIN)/python bench/append_throughput.py
	$(BIN)/python bench/conductor_overhead.py
	$(BIN)/python bench/verify_speed.py
	$(BIN)/python bench/llm_gateway.py
	$(BIN)/python bench/readmodel_save.py

clean:
	rm -rf $(VENV) kernelflow-runs .pytest_cache
