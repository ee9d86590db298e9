# Two commands for a new user: `make demo` (install + quickstart) and `make test` (install + tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_METHODS ?= fedavg fedprox ewc er gpm fot

.PHONY: install demo test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,ray]"
	touch $@

demo: install
	@for m in $(DEMO_METHODS); do \
	  $(BIN)/cfl run configs/quickstart.yaml --set method.name=$$m --out runs/quickstart/$$m --overwrite || exit 1; \
	done
	@echo; echo "Quickstart table (outputs under runs/quickstart/<method>/):"
	@$(BIN)/cfl report runs/quickstart

test: install
	$(BIN)/ruff check cfl tests benchmarks
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check cfl tests benchmarks

clean:
	rm -rf runs .pytest_cache .ruff_cache
