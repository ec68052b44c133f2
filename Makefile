# Two commands do all the set-up on a fresh machine: `make demo` and `make test`. Every target is idempotent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: venv test demo bench clean cluster-configs

# The toolkit with its admin (aws-parallelcluster) and test extras, editable.
$(VENV)/.core-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[admin,test,reports]'
	touch $@

venv: $(VENV)/.core-installed

test: venv
	$(BIN)/python -m pytest -q

# Cold start-up medians: hpc --help and hpc cluster validate beside pcluster version (prints, not a test).
bench: venv
	$(BIN)/python benchmarks/bench_cli.py

# Rewrite cluster-configs/*.yaml with the command recorded in each file's header.
cluster-configs: venv
	$(BIN)/python cluster-configs/regenerate.py

clean:
	rm -rf $(VENV) .pytest_cache
