# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test lint unit engines clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: install
	$(BIN)/batchlab run scenarios/quickstart.yaml

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest -q -m "not real_engine"

# Real engines for the real_engine tests: vLLM on CPU and tiny local models (cached; see script).
engines:
	bash scripts/setup_engines.sh

test: lint engines
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
