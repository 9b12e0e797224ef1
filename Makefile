# Two commands: `make demo` and `make test`. Each creates .venv with the pinned
# dependencies on first use (Python 3.11 and pip are all a machine needs).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -c requirements/constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hybridpar train --config configs/quickstart.yaml

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not keras_suite"
	$(BIN)/python -m pytest -q -m keras_suite

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not multiworker and not keras_suite"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
