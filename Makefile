# Two commands: `make demo` and `make test`. Each creates .venv with the pinned
# dependencies on first use (Python 3.11 and pip are all a machine needs).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray
PIP_INSTALL := $(BIN)/python -m pip install --quiet -c requirements/constraints.txt

.PHONY: demo test test-fast lint bench gpu docs clean

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(PIP_INSTALL) -e ".[test]"
	touch $(STAMP)

# The tests also run on Ray (the `ray` extra); `make demo` does without it.
$(RAY_STAMP): $(STAMP)
	$(PIP_INSTALL) -e ".[test,ray]"
	touch $(RAY_STAMP)

# NVIDIA's CUDA and cuDNN wheels beside the `tensorflow` package hybridpar depends on
# (its Linux wheel is one build for CPU and GPU).
gpu: $(STAMP)
	$(PIP_INSTALL) -e ".[gpu]"

demo: $(STAMP)
	$(BIN)/hybridpar train --config configs/quickstart.yaml

# Two pytest-xdist workers: the multi-process tests spend much of their time waiting on
# their clusters, and the other worker fills that time. The Ray tests share one worker
# (one Ray cluster; tests/conftest.py).
test: $(RAY_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not multiworker and not keras_suite and not ray"

# The documentation site in site/ (mkdocs.yml is strict: a broken link fails the build).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache *.egg-info
