# make demo: create .venv, install, run the demo on scikit-learn's handwritten digits, read from its wheel (CPU).
# make test: create .venv if needed, lint (ruff), run every test (the README's and CI's command).
# make test-fast: the inner loop: every test but the slow and Ray tiers (about 4 min on a 2-core machine:
#   229 s wall, measured 2026-11-27 with nothing else running; docs/architecture.md 5.5).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch/torchvision first, pinned to what pip serves here (no newer torch is required)
	$(BIN)/python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The demo search writes results/demo; a previous demo is kept as results/demo-<time>, never overwritten.
demo: $(STAMP)
	@if [ -d results/demo ]; then mv results/demo results/demo-$$(date +%Y%m%d-%H%M%S); fi
	$(BIN)/cem-bench search search_spaces/demo.yaml --storage results --name demo

lint: $(STAMP)
	$(BIN)/ruff check cem_bench tests scripts

# The autoscaling tests run in a pytest process of their own: their in-process Ray driver connects with
# RAY_AUTH_MODE=disabled, which Ray keeps for the process, and a later in-process ray.init() of a new local
# cluster (tests/test_search.py) then fails its GCS's token check (the clean-clone CI runs of 2026-11-27)
test: lint
	$(BIN)/python -m pytest -q --durations=15 --ignore=tests/test_cluster_autoscale.py
	$(BIN)/python -m pytest -q tests/test_cluster_autoscale.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not ray"

bench: $(STAMP)
	$(BIN)/cem-bench bench --quick

clean:
	rm -rf $(VENV) build *.egg-info
