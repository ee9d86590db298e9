# Two commands for a new user: `make demo` (install + quickstart) and `make test` (install + tests, the CI command);
# `make check` is the quick subset (ruff + the tests not marked slow: tests/conftest.py, SLOW).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_METHODS ?= fedavg fedprox ewc er gpm fot
# Per-method --set flags for the demo: FedProx's default mu (0.01) is too weak to move the quickstart's numbers
# off FedAvg's, so the demo shows it at mu = 1.0. Override with e.g. `make demo DEMO_SET_fedprox=`.
DEMO_SET_fedprox ?= --set method.mu=1.0

.PHONY: install demo test check lint clean

install: $(VENV)/.installed

# torch and torchvision first, in one pip call from one index (cfl/torch_wheels.py chooses it: PyTorch's CPU index
# where it is reachable on a machine without an NVIDIA driver, else pip's own; `make TORCH_INDEX=URL` or
# TORCH_INDEX=default to choose); the package's own install then keeps them.
TORCH_INDEX ?=
export TORCH_INDEX

$(VENV)/.installed: pyproject.toml cfl/install_check.py cfl/torch_wheels.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch torchvision $$($(BIN)/python -m cfl.torch_wheels)
	$(BIN)/python -m pip install --quiet -e ".[dev,ray,pretrained]"
	$(BIN)/python -m cfl.install_check  # torch and torchvision import together, or the fix is printed
	touch $@

demo: install
	@$(foreach m,$(DEMO_METHODS),$(BIN)/cfl run configs/quickstart.yaml --set method.name=$(m) $(DEMO_SET_$(m)) \
	  --out runs/quickstart/$(m) --overwrite && ) true
	@echo; echo "Quickstart table (outputs under runs/quickstart/<method>/):"
	@$(BIN)/cfl report runs/quickstart

test: install
	$(BIN)/ruff check cfl tests benchmarks
	$(BIN)/python -m pytest

check: install
	$(BIN)/ruff check cfl tests benchmarks
	$(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check cfl tests benchmarks

clean:
	rm -rf runs .pytest_cache .ruff_cache
