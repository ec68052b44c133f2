# Two commands do all the set-up on a fresh machine: `make demo` and `make test`. Every target is idempotent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: venv test demo bench clean slurm-up slurm-down cluster-configs

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

# Cold start-up medians: hpc --help and hpc cluster validate beside pcluster version (prints, not a test).
bench: venv
	$(BIN)/python benchmarks/bench_cli.py

# Rewrite cluster-configs/*.yaml with the command recorded in each file's header.
cluster-configs: venv
	$(BIN)/python cluster-configs/regenerate.py

clean:
	rm -rf $(VENV) .pytest_cache

# Reviewed renders in jobs/ (tests/test_jobs_dir.py checks they match today's rendering).
JOBS := roberta:8 transformer:4 resnet50:8 nccl-tests:2 collectives:2
.PHONY: jobs
jobs: venv
	@for job in $(JOBS); do name=$${job%%:*}; nodes=$${job##*:}; \
	  $(BIN)/python -m toolkit recipes render $$name --nodes $$nodes --cluster jobs/p3dn-cluster.yaml --queue p3dn \
	    -o jobs/$$name-$${nodes}xp3dn.sbatch --force || exit 1; done
