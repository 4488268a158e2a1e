# make demo: create .venv, install, run the demo on the built-in synthetic dataset (CPU is fine).
# make test: create .venv if needed, run the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean bench

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

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/cem-bench bench --quick

clean:
	rm -rf $(VENV) build *.egg-info
