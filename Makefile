# Two commands: `make demo` and `make test`. Each creates .venv with the pinned
# dependencies on first use (Python 3.11 and pip are all a machine needs).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray
PIP_INSTALL := $(BIN)/python -m pip install --quiet -c requirements/constraints.txt

.PHONY: demo test test-zoo-heavy test-fast test-versions lint bench gpu docs clean

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
# (one Ray cluster; tests/conftest.py). The zoo's longest rows (marker zoo_heavy) run in
# test-zoo-heavy, which CI runs after it, so that this stays under 35 minutes on 2 cores.
test: $(RAY_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25 -m "not zoo_heavy"

test-zoo-heavy: $(RAY_STAMP)
	$(BIN)/python -m pytest -q -n 2 --durations=10 -m zoo_heavy tests/zoo

# Every other supported TensorFlow/Keras pair (hybridpar/compat/versions.py), each in an
# environment pinned by requirements/versions/<pair>.txt: all the upstream reproductions
# (a fix whose upstream behaviour is gone shows there); then, on the oldest TensorFlow's
# and the oldest Keras's pair (the ends of the matrix; the pairs between them differ from
# an end in one minor version), a subset across the modes. That keeps CI under its 90
# minutes: each subset run takes about 3 minutes on 2 cores.
VERSION_PAIRS := $(sort $(basename $(notdir $(wildcard requirements/versions/*.txt))))
VERSION_MODE_PAIRS := tf2.19-keras3.15 tf2.21-keras3.13
VERSION_TESTS := $(addprefix tests/strategy/,test_compat_upstream.py test_equivalence.py \
	test_compat_scoping.py test_compat_parameter_server.py test_compat_steps.py \
	test_pipeline.py test_zero.py test_compression.py test_checkpoints_in_one_process.py \
	test_trainer.py test_resumable_input.py)

.venv-versions/%/.installed: requirements/versions/%.txt pyproject.toml
	$(PYTHON) -m venv .venv-versions/$*
	.venv-versions/$*/bin/python -m pip install --quiet --upgrade "pip>=24"
	.venv-versions/$*/bin/python -m pip install --quiet -c $< -e . pytest pytest-xdist portpicker
	touch $@

test-versions: $(VERSION_PAIRS:%=.venv-versions/%/.installed)
	for pair in $(VERSION_PAIRS); do \
		echo "== $$pair" && \
		.venv-versions/$$pair/bin/python -m pytest -q -n 2 -p no:cacheprovider -m upstream tests && \
		{ case " $(VERSION_MODE_PAIRS) " in *" $$pair "*) \
			.venv-versions/$$pair/bin/python -m pytest -q -n 2 -p no:cacheprovider \
				-m "not upstream" $(VERSION_TESTS);; esac; } \
		|| exit 1; \
	done

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
	rm -rf $(VENV) .venv-versions runs site .pytest_cache .ruff_cache *.egg-info
