# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch; an unpinned torch pulls several GB of CUDA packages.
TORCH_PIN ?= torch==2.13.0

export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install run lint test test-fast docs bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev,ray]"
	touch $(STAMP)

run: install
	$(PY) -m minivllm

# The linter, the formatter (a check: `ruff format` fixes) and the package graph's
# contracts (.importlinter, drawn in docs/ARCHITECTURE.md).
LINTED := minivllm tests benchmarks tools examples
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports

# One intra-op thread per process: the suite's models are tiny, and several
# processes (tp ranks, servers, engine processes) share the cores.
test: lint
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q --timeout=600 --durations=25 -n 2 --dist loadfile

# The suite without the tests marked `slow` (more than a few seconds each on a 2-core CPU).
test-fast: lint
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q --timeout=600 -n 2 --dist loadfile -m "not slow"

docs: install
	$(PY) tools/gen_config_docs.py > docs/CONFIG.md

bench: install
	$(PY) -m minivllm task=bench

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
