# Two set-up commands for a fresh machine with Python 3.11 and make:
#   make run   — create .venv, install, run the main job on the embedded default
#   make test  — create/update .venv and pass the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv lint eval bench-engine bench-search train-target clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gambit run

test: $(STAMP)
	$(VENV)/bin/ruff check services tests
	$(VENV)/bin/pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check services tests

# Figures in the README come from these commands.
eval: $(STAMP)
	$(VENV)/bin/gambit eval --split test --samples 16 --json results/eval_test.json

bench-engine: $(STAMP)
	$(VENV)/bin/gambit bench engine --json results/bench_engine.json

bench-search: $(STAMP)
	$(VENV)/bin/gambit bench search --quick --json results/bench_search_quick.json

train-target: $(STAMP)
	$(VENV)/bin/gambit train target

-include services/gambit/bench/vllm.mk

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
