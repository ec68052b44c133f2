# Two commands do all the set-up on a fresh machine: `make demo` and `make test`. Every target is idempotent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: venv train-env test demo bench clean

# The toolkit with its admin (aws-parallelcluster) and test extras, editable.
$(VENV)/.core-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[admin,test,reports]'
	touch $@

venv: $(VENV)/.core-installed

# The training environment (workloads and their tests): torch and torchvision from this machine's disk, then
# fairseq-fixed compiled against that torch (~4 min, ~6 GB). Own stamp and no dependency on the core stamp, so
# it can be added to any venv without reinstalling the toolkit there. The torch pins are repeated on every
# install line so that no dependency can swap torch for another release.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
$(VENV)/.train-installed:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_PINS)
	$(PIP) install $(TORCH_PINS) cython numpy setuptools wheel scikit-learn
	$(PIP) install --no-build-isolation $(TORCH_PINS) fairseq-fixed==0.12.3.1
	$(BIN)/python -c 'import torch, torchvision, fairseq, sklearn; assert torch.__version__.startswith("2.14.1"), torch.__version__'
	touch $@

train-env: $(VENV)/.train-installed

test: venv train-env
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
