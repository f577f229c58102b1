# The two commands: `make demo` (install what the local default uses, then run the whole pipeline on the small data
# set with 2 workers; no root) and `make test` (install everything, then run the test suite). Both are idempotent; a
# warm machine reuses the venv and the cached Horovod wheel.
PYTHON ?= python3
VENV ?= .venv
# Horovod is compiled once per torch and TensorFlow version and patch (containers/build/) and kept outside the checkout,
# so fresh clones reuse it; the wheel is reinstalled over an older build of the same version.
WHEEL_CACHE ?= $(HOME)/.cache/trainflow/wheels
WORKDIR ?= .trainflow
PYTEST_ARGS ?=
# `make demo LAUNCHER=horovodrun` trains with Horovod instead of torch.distributed (PyTorch's default, torchrun);
# `make demo FRAMEWORK=keras` (or tensorflow) trains with that framework, under horovodrun. Each installs its layer.
LAUNCHER ?=
FRAMEWORK ?=
TF_PIN := $(shell grep -oE '"tensorflow-cpu==[^"]+"' pyproject.toml | tr -d '"')
TF_KERAS := containers/requirements/tf-keras.txt
HOROVOD_BUILD := $(addprefix containers/build/,horovod-wheel.sh horovod-idle-cycle.patch horovod-tensorflow.patch)
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q
# uv (pinned in the lock, installed by pip) installs the layers from the lock: faster than pip alone, measured by
# `trainflow bench install` (docs/benchmarks/). INSTALLER=pip installs them with pip alone.
INSTALLER ?= uv
# containers/build/install.sh runs uv as pip would (the system's certificate store, bytecode compiled: every command,
# worker and test imports Prefect, torch or TensorFlow), and pip where uv cannot connect, saying so.
INSTALL := INSTALLER=$(INSTALLER) containers/build/install.sh $(BIN)

# The venv in layers, each a stamp file in it, each installed when a target needs it (README: Install):
#   base        PyTorch, torchvision, Prefect, the Azure SDKs, MLflow: all the local default runs (make demo)
#   tensorflow  TensorFlow (CPU) and tf_keras: FRAMEWORK=keras or tensorflow on this machine (make setup-tensorflow)
#   horovod     Horovod, compiled against the frameworks installed: LAUNCHER=horovodrun (make setup-horovod)
#   dev         the tests', lint's and docs' tools over all of the above (make test)
BASE := $(VENV)/.base
TF_LAYER := $(VENV)/.tensorflow
HVD_LAYER := $(VENV)/.horovod
DEV_LAYER := $(VENV)/.dev
# Horovod is built against what is installed, so with TensorFlow where its layer is there or is wanted now.
WANTS_TF := $(or $(WITH_TF),$(filter keras tensorflow,$(FRAMEWORK)),$(filter setup test lint docs,$(MAKECMDGOALS)),$(wildcard $(TF_LAYER)))
# checkov (the Bicep lint of tests/unit/infra/compute/test_azure_templates.py) has its own venv: its pins (packaging<24,
# networkx<2.7, cachetools<6) conflict with the project's (pytest and wheel need packaging>=24).
TOOLS_VENV ?= .venv-tools
CHECKOV ?= checkov==3.3.30

.PHONY: setup setup-tensorflow setup-horovod docker-setup tools demo lint check test test-long bench device-check docs clean
# Everything `make test` needs, at once (the venv's layers are one chain of pip processes; npm, apt and the tools'
# venv wait on the network and the disk meanwhile): measured from a clean clone, see the README.
SETUP_PARTS := $(DEV_LAYER) node_modules/.installed docker-setup tools
setup:
	$(MAKE) --no-print-directory -j4 WITH_TF=1 $(SETUP_PARTS)
# TensorFlow on its own, and Horovod rebuilt with its ops where Horovod is installed.
setup-tensorflow: $(TF_LAYER)
	$(if $(wildcard $(HVD_LAYER)),$(MAKE) --no-print-directory WITH_TF=1 $(HVD_LAYER))
setup-horovod: $(HVD_LAYER)

# The container tests' Docker engine, registry and base-image maker, and the UI test's browser (chromium, driven
# by playwright), from Debian's packages (needs root or sudo; skipped when all are installed). The tests start
# dockerd and the registry themselves. Only `make test` needs them.
DOCKER_TOOLS := dockerd docker-registry debootstrap chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
docker-setup:
	@for tool in $(DOCKER_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-registry debootstrap chromium >/dev/null; \
	fi

# Every version comes from the lock (pip -c $(LOCK)): the index gains releases between two installs.
LOCK := containers/requirements/constraints.txt
$(BASE): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(filter uv,$(INSTALLER)),$(PIP) -c $(LOCK) uv)
	$(INSTALL) -c $(LOCK) setuptools wheel -e .
	touch $@

# tf_keras with --no-deps (TF_KERAS says why).
$(TF_LAYER): $(BASE) $(TF_KERAS)
	$(INSTALL) -c $(LOCK) $(TF_PIN)
	$(INSTALL) -c $(LOCK) --no-deps -r $(TF_KERAS)
	touch $@

$(HVD_LAYER): $(BASE) $(HOROVOD_BUILD) $(if $(WANTS_TF),$(TF_LAYER))
	wheel=$$(containers/build/horovod-wheel.sh $(BIN)/python $(WHEEL_CACHE)) && \
	  $(PIP) --force-reinstall --no-deps "$$wheel" && $(PIP) -c $(LOCK) "$$wheel"
	touch $@

$(DEV_LAYER): $(BASE) $(TF_LAYER) $(HVD_LAYER)
	$(INSTALL) -c $(LOCK) -e '.[dev,docs]'
	touch $@

tools: $(TOOLS_VENV)/.installed
$(TOOLS_VENV)/.installed: Makefile
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	echo '*' > $(TOOLS_VENV)/.gitignore  # the venv ignores itself (as Python 3.13's venv does)
	$(TOOLS_VENV)/bin/pip install -q "$(CHECKOV)"
	touch $@

# Azurite (the Blob emulator of the local default and the tests), pinned by package-lock.json.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The demo installs only the layers its run uses (no root): the base and Azurite at once, and TensorFlow or Horovod
# when FRAMEWORK or LAUNCHER asks for them.
DEMO_PARTS := $(strip $(BASE) node_modules/.installed $(if $(filter keras tensorflow,$(FRAMEWORK)),$(TF_LAYER) \
  $(HVD_LAYER),$(if $(filter horovodrun,$(LAUNCHER)),$(HVD_LAYER))))
demo:
	$(MAKE) --no-print-directory -j2 $(DEMO_PARTS)
	$(if $(LAUNCHER),TRAINFLOW_TRAINING__LAUNCHER=$(LAUNCHER)) $(BIN)/trainflow run --config flows/configs/demo.yaml \
	  --workdir $(WORKDIR) $(if $(FRAMEWORK),--framework $(FRAMEWORK))

# The project's own checks (also run by `make test`, and before each commit by .pre-commit-config.yaml): ruff's lint
# and format, the type checker, and the import contracts of pyproject.toml (the layers of the house).
LINT_ENV := PYTHONPATH=.:containers
lint: $(DEV_LAYER)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(LINT_ENV) $(BIN)/mypy
	$(LINT_ENV) $(BIN)/lint-imports --no-cache

# Two test processes (pytest-xdist): while one waits on a service, a launcher or the network, the other computes.
# tests/conftest.py keeps every Docker test on one of them. TEST_WORKERS=0 runs the suite in this one process. The
# 25 slowest tests are listed at the end: where the suite's time goes. The tests marked `long` (the benchmark
# commands' own runs, the trainings compared by accuracy: a number each, not a behaviour) are left out, so that the
# suite fits CI's 90 minutes on a 2-core machine: `make test-long` runs them, `make test TEST_MARKS=` everything.
TEST_WORKERS ?= 2
TEST_MARKS ?= not long
# Every phase of every test and every costly fixture set-up, with its worker and start, as JSON lines
# (tests/timeline.py): `python -m tests.timeline .test-timeline.jsonl` says where the run's time went. One word,
# --timeline=PATH: an xdist worker parses its arguments before it loads the plugin, and would take a PATH word
# outside the checkout for a test path (its rootdir then has no pyproject.toml, and no plugin).
TEST_TIMELINE ?= .test-timeline.jsonl
test: setup lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 -m "$(TEST_MARKS)" \
	  $(if $(TEST_TIMELINE),--timeline=$(TEST_TIMELINE)) $(PYTEST_ARGS)

# The inner loop, before each commit: the checks of `lint` and the unit tests (no service, no launcher, no image).
check: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit $(PYTEST_ARGS)

test-long:
	$(MAKE) --no-print-directory test TEST_MARKS=long

bench: $(BASE) node_modules/.installed
	$(BIN)/trainflow bench train --workdir $(WORKDIR) --json $(WORKDIR)/bench-train.json

# The device check (benchmarks/device_check.py): on a lent GPU machine, which has no network and no venv (so no
# `setup` first), under 8 minutes; without a GPU it checks what it can and exits 2. The venv's Python where there is one.
DEVICE_CHECK_OUT ?= $(WORKDIR)/device-check
DEVICE_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
device-check:
	PYTHONPATH=containers $(DEVICE_PYTHON) -m benchmarks.device_check --out $(DEVICE_CHECK_OUT)

# The documentation site (mkdocs.yml): the reference pages written afresh from the code (cli/reference.py), then
# the site built into site/ with --strict, as the tests build it (tests/integration/test_docs_site.py).
docs: $(DEV_LAYER)
	$(BIN)/python -m cli.reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) $(TOOLS_VENV) $(WORKDIR) site
