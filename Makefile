# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test lint unit engines clean

# The project's own bytecode, as an installed package has it: with PYTHONDONTWRITEBYTECODE set
# (as on CI machines) an editable install would compile every module it imports at each start
# of a command, about a tenth of a second. Only modules changed since are compiled again.
install: $(VENV)/.installed
	$(BIN)/python -m compileall -q harness adapters

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
