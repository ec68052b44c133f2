# Two commands do all the set-up on a fresh machine: `make demo` and `make test`. Every target is idempotent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: chromium bench-deps venv train-env slurm-up slurm-lanes container-lane slurm-down lint test canaries demo bench jobs k8s-jobs recipe-schema cluster-configs clean

# The torch pins are repeated on every install line that may pull torch, so that no dependency can swap it.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

# The toolkit with its admin (aws-parallelcluster), report and test extras, editable.
$(VENV)/.core-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[admin,test,reports]'
	touch $@

venv: $(VENV)/.core-installed

# The training environment (workloads and their tests): torch and torchvision from this machine's disk, then
# fairseq-fixed compiled against that torch, DeepSpeed (its config parser checks generated configs on CPU) and
# Hugging Face Accelerate (launcher kind accelerate: its parser checks the argv hpc writes) (~4 min, ~6 GB). Own
# stamp and no dependency on the core stamp, so it can be added to any venv without reinstalling the toolkit there.
$(VENV)/.train-installed:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_PINS)
	$(PIP) install $(TORCH_PINS) cython numpy setuptools wheel scikit-learn
	$(PIP) install --no-build-isolation $(TORCH_PINS) fairseq-fixed==0.12.3.1
	$(PIP) install $(TORCH_PINS) deepspeed==0.19.8
	$(PIP) install $(TORCH_PINS) accelerate==1.15.0
	$(BIN)/python -c 'import torch, torchvision, fairseq, sklearn, deepspeed, accelerate; assert torch.__version__.startswith("2.14.1"), torch.__version__'
	touch $@

train-env: $(VENV)/.train-installed

# The local test cluster (a real Slurm with accounting; needs root): idempotent, fast when already up. It is
# the test bench (testbench/, beside the package, never shipped). hpc finds it as it finds any cluster: through
# SLURM_CONF and HPC_CLUSTER_CONFIG, which `python -m testbench env` prints (LOCAL_CLUSTER sets them).
# SLURM=24.11 (trixie's) or SLURM=26.05 (forky's, the newest Debian has): that Slurm from a Debian root file system
# (built once, 30-60 s, cached in /var/tmp), beside it.
SLURM ?=
SLURM_FLAG := $(if $(SLURM),--slurm $(SLURM))
LOCAL_CLUSTER = exports="$$($(BIN)/python -m testbench env $(SLURM_FLAG))" && eval "$$exports" &&
slurm-up: venv
	$(BIN)/python -m testbench up $(SLURM_FLAG)

slurm-down: venv
	$(BIN)/python -m testbench down $(SLURM_FLAG)

# The newer lanes the conformance tests also run on (tests bring them up themselves where they are down): built
# here, before the tests, one after the other (each may apt-get on this machine), so their 30-60 s builds on a
# fresh machine are set-up, as the default lane's is.
NEWER_LANES := 24.11 26.05
# The node lane: this machine's 22.05 controller with Debian bullseye nodes (slurmd 20.11, python3 3.9) that share
# only /fsx with the submitter (tests/test_node_lane.py); its root file system takes about a minute to build, once.
NODE_LANES := bullseye
slurm-lanes: venv
	for v in $(NEWER_LANES) $(NODE_LANES); do $(BIN)/python -m testbench up --slurm $$v || exit 1; done

# The container lane: this machine's Slurm 22.05 again with NVIDIA pyxis + enroot built from the pinned sources in
# ../shared/containers (or $$HPC_CONTAINER_SOURCES) and a small image made with debootstrap (testbench/containers.py;
# about a minute from nothing, cached under /var/tmp). Without the sources it says so and the container tests skip.
container-lane: venv
	@if $(BIN)/python -c 'from testbench.containers import find_sources; raise SystemExit(find_sources() is None)'; \
	then $(BIN)/python -m testbench up --slurm 22.05-pyxis; \
	else $(BIN)/python -c 'from testbench.containers import missing_sources; print(missing_sources())'; fi

# ruff and mypy (pinned in the test extra, configured in pyproject.toml), first in `make test` and so in CI. After
# train-env: mypy reads torch's own types where the workloads use it.
lint: venv train-env
	$(BIN)/ruff check
	$(BIN)/mypy

# Debian's headless Chromium: tests/test_run_page.py opens the run pages (`hpc report html`) in it from disk.
# Non-interactive: CI has no terminal for debconf's questions.
chromium:
	command -v chromium >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium || \
	  { apt-get update -q && apt-get install -y -q chromium; }; }

# Two xdist workers: the Slurm tests mostly wait on Slurm, so the unit tests run beside them; each lane's tests stay
# in order on one worker (tests/conftest.py lane_group). `pytest tests/test_x.py` alone runs in one process.
# --durations: the slowest tests, at the end of every run (the suite's budget is 15 minutes of test time).
test: lint venv train-env slurm-up slurm-lanes container-lane chromium
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=30

# Checks of third parties' behaviour we rely on (torch's restart hang, Slurm's own features): not our code, so
# not in `make test`; run them when upgrading torch or Slurm.
canaries: venv train-env slurm-up
	$(BIN)/python -m pytest -q -m canary

# The main job: a small real recipe on the local Slurm (or on this machine where no Slurm can run).
demo: venv train-env slurm-up
	$(LOCAL_CLUSTER) $(BIN)/hpc recipes submit roberta --nodes 2 --profile smoke --wait

# Benchmarks print figures and ratios against a baseline run in the same command (not timed tests).
bench: venv train-env slurm-up container-lane bench-deps
	$(BIN)/python benchmarks/bench_cli.py
	$(LOCAL_CLUSTER) $(BIN)/python benchmarks/bench_submit.py
	$(LOCAL_CLUSTER) $(BIN)/python benchmarks/bench_run.py
	$(BIN)/python benchmarks/bench_containers.py
	$(BIN)/python benchmarks/bench_heartbeat.py
	$(BIN)/python benchmarks/bench_stragglers.py
	$(LOCAL_CLUSTER) $(BIN)/python benchmarks/bench_spares.py
	$(LOCAL_CLUSTER) $(BIN)/python benchmarks/bench_nodesearch.py

# What only the benchmarks compare against: NVIDIA's straggler detector (nvidia-resiliency-ext 0.4.1, the newest
# release for Python 3.11) and the CUPTI 12 library it loads at start even when it times on the host. In a folder
# of its own (benchmarks/bench_stragglers.py puts it on the path of NVRx's ranks only): its pynvml would make every
# `import torch.cuda` in the venv warn, which the tests would see.
BENCH_SITE := $(VENV)/bench-site
$(VENV)/.bench-installed:
	$(PIP) install --no-deps --target $(BENCH_SITE) nvidia-resiliency-ext==0.4.1 nvidia-cuda-cupti-cu12
	touch $@

bench-deps: $(VENV)/.bench-installed

# Reviewed renders in jobs/ (tests/test_render.py checks they match today's rendering). Each its own run dir:
# the job writes its DeepSpeed config and checkpoints there, which a render at another node count must not share.
JOBS := roberta:8 transformer:4 resnet50:8 nccl-tests:2 collectives:2
DL1_JOBS := bert-5b:16 collectives:4 resnet50:8
jobs: venv
	@for job in $(JOBS); do name=$${job%%:*}; nodes=$${job##*:}; \
	  $(BIN)/python -m toolkit recipes render $$name --nodes $$nodes --cluster jobs/p3dn-cluster.yaml --queue p3dn --run-dir /fsx/runs/$$name-$${nodes}xp3dn \
	    -o jobs/$$name-$${nodes}xp3dn.sbatch --force || exit 1; done
	@for job in $(DL1_JOBS); do name=$${job%%:*}; nodes=$${job##*:}; \
	  $(BIN)/python -m toolkit recipes render $$name --nodes $$nodes --cluster jobs/dl1-cluster.yaml --queue dl1 --run-dir /fsx/runs/$$name-$${nodes}xdl1 \
	    -o jobs/$$name-$${nodes}xdl1.sbatch --force || exit 1; done
	@mkdir -p jobs/containers
	$(BIN)/python -m toolkit recipes render resnet50 --profile container --nodes 8 --cluster jobs/p3dn-cluster.yaml --queue p3dn \
	  --run-dir /fsx/runs/resnet50-container-8xp3dn -o jobs/containers/resnet50-8xp3dn.sbatch --force

# Reviewed Kubernetes renders: Kubeflow v1 (PyTorchJob/MPIJob) in jobs/k8s/, Trainer v2 (TrainJob) in
# jobs/k8s/trainer-v2/ (tests/test_k8s_examples.py and tests/test_k8s_trainer_v2.py check they match today's rendering).
K8S_JOBS := resnet50:3:p4d.24xlarge roberta:8:p5.48xlarge nccl-tests:2:p4d.24xlarge
k8s-jobs: venv
	@mkdir -p jobs/k8s/trainer-v2
	@for job in $(K8S_JOBS); do name=$${job%%:*}; rest=$${job#*:}; nodes=$${rest%%:*}; itype=$${rest#*:}; \
	  $(BIN)/python -m toolkit k8s render $$name --nodes $$nodes --instance $$itype --fsx-storage-class fsx-lustre \
	    --api v1 -o jobs/k8s/$$name-$${nodes}x$${itype%%.*}.yaml --force || exit 1; \
	  $(BIN)/python -m toolkit k8s render $$name --nodes $$nodes --instance $$itype --fsx-storage-class fsx-lustre \
	    -o jobs/k8s/trainer-v2/$$name-$${nodes}x$${itype%%.*}.yaml --force || exit 1; done

# The recipes' JSON Schema for editors, generated from toolkit/recipes/schema.py (tests/test_recipe_schema.py
# checks the shipped file matches; recipes/recipe.schema.json links to it).
recipe-schema: venv
	$(BIN)/python -m toolkit recipes schema -o toolkit/recipes/recipe.schema.json --force

# Rewrite cluster-configs/*.yaml with the command recorded in each file's header.
cluster-configs: venv
	$(BIN)/python cluster-configs/regenerate.py

clean:
	rm -rf $(VENV) .pytest_cache
