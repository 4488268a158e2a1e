# make demo: create .venv, install, run the demo on scikit-learn's handwritten digits, read from its wheel (CPU).
# make test: create .venv if needed, lint (ruff), run every test (the README's and CI's command), as two pytest
#   processes side by side (scripts/test_tiers.py).
# make test-fast: the inner loop: every test but the slow and Ray tiers (about 4 min on a 2-core machine:
#   229 s wall, measured 2026-11-27 with nothing else running; docs/architecture.md 5.5).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean bench constraints

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

# Every test, as two pytest processes side by side (scripts/test_tiers.py says why): the Ray tier, then the
# autoscaling tests in a process of their own; beside them, every other test.
test: lint
	$(BIN)/python scripts/test_tiers.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not ray"

# cluster-constraints.txt: the versions of this .venv's number-shaping libraries, which cluster.yaml installs on
# every node (its header says why); run after a `make install` whose tests passed.
CONSTRAINED := ImageIO|Jinja2|matplotlib|numpy|optuna|pandas|pillow|pyarrow|PyYAML|scikit-image|scikit-learn|scipy|tifffile
constraints: $(STAMP)
	{ sed -n '/^#/p' cluster-constraints.txt; $(BIN)/python -m pip freeze | grep -E '^($(CONSTRAINED))==' | sort -f; } \
		> cluster-constraints.txt.new && mv cluster-constraints.txt.new cluster-constraints.txt

bench: $(STAMP)
	$(BIN)/cem-bench bench --quick

clean:
	rm -rf $(VENV) build *.egg-info
