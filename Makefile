# Set up and run. `make smoke` trains a small model on CPU; `make test` runs the test suite.
# TORCH_SPEC chooses the torch to install: on these machines torch==2.13.0 is the CPU wheel on disk;
# on a GPU cluster use e.g. TORCH_SPEC='torch>=2.9' (or a CUDA wheel index in PIP_EXTRA_INDEX_URL).
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY         := $(VENV)/bin/python
PYTEST_ARGS ?=
# Three workers on two cores: the cluster tests that need the cluster to themselves in order on one, the rest on
# the others, the cluster tests that share it last on all three (tests/support/side_by_side.py). The cluster tests
# spend much of their time waiting for Slurm: a third worker fills it (docs/performance.md, "The suite's workers").
PYTEST_XDIST ?= -n 3 --dist loadgroup

.PHONY: venv smoke test test-release lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

smoke: venv
	$(PY) launch.py jobs/smoke.yaml --local

test: venv
	$(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# The tests whose outcome depends on the Slurm release, on the cluster that is up (CI: the second release).
test-release: venv
	$(PY) -m pytest $(PYTEST_XDIST) -m slurm_release $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs jobs/*/ .pytest_cache
