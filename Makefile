# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch is pinned: the CPU wheel of this version is what the project is built and tested with,
# and an unpinned install would pull a multi-GB CUDA build.
TORCH   := torch==2.13.0

.PHONY: demo test fuzz lint bench clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev,bench,gpu]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m vfuse.demo

test: $(STAMP)
	$(BIN)/python -m pytest

# The differential fuzzer on fresh random programs for VFUSE_FUZZ_MINUTES (default 10), each
# round's seed printed, then every OpInfo sample (VFUSE_FUZZ_OPINFO=0 skips that part).
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.soak

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python -m vfuse.bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
