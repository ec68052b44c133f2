# Two commands do all the set-up on a fresh machine: `make demo` and `make test`. Every target is idempotent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: venv test demo bench clean slurm-up slurm-down

# The toolkit with its admin (aws-parallelcluster) and test extras, editable.
$(VENV)/.core-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[admin,test,reports]'
	touch $@

venv: $(VENV)/.core-installed

test: venv slurm-up
	$(BIN)/python -m pytest -q

# The local test cluster (a real Slurm with accounting; needs root): idempotent, fast when already up.
slurm-up: venv
	$(BIN)/python -m toolkit sandbox up

slurm-down: venv
	$(BIN)/python -m toolkit sandbox down

clean:
	rm -rf $(VENV) .pytest_cache
