# Two entry points: `make demo` runs a workflow on a LocalCluster with Crux attached and
# prints its workflow critical path; `make test` runs the test suite.  Both create .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/activate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(BIN)/activate

demo: $(BIN)/activate
	$(BIN)/crux-dask demo

test: $(BIN)/activate
	$(BIN)/python -m pytest

lint: $(BIN)/activate
	$(BIN)/ruff check .

bench: $(BIN)/activate
	$(BIN)/python benchmarks/core_scale.py

clean:
	rm -rf $(VENV) build *.egg-info
