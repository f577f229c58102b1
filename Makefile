# The two commands: `make demo` (set up, then run the whole pipeline on the small data set with 2 workers) and
# `make test` (set up, then run the test suite). Both are idempotent; a warm machine reuses the venv
# and the cached Horovod wheel.
PYTHON ?= python3
VENV ?= .venv
# Horovod is compiled once per torch and TensorFlow version and patch (containers/build/) and kept outside the checkout,
# so fresh clones reuse it; the wheel is reinstalled over an older build of the same version.
WHEEL_CACHE ?= $(HOME)/.cache/trainflow/wheels
WORKDIR ?= .trainflow
PYTEST_ARGS ?=
# `make demo LAUNCHER=horovodrun` trains with Horovod instead of torch.distributed (PyTorch's default, torchrun);
# `make demo FRAMEWORK=keras` (or tensorflow) trains with that framework, under horovodrun.
LAUNCHER ?=
FRAMEWORK ?=
# The frameworks must be installed before Horovod is built against them (its wheel then has both): torch, torchvision
# and tensorflow-cpu at pyproject.toml's pins, and tf_keras with --no-deps (TF_KERAS says why).
FRAMEWORK_PINS := $(shell grep -oE '"(torch|torchvision|tensorflow-cpu)==[^"]+"' pyproject.toml | tr -d '"')
TF_KERAS := containers/requirements/tf-keras.txt
HOROVOD_BUILD := $(addprefix containers/build/,horovod-wheel.sh horovod-idle-cycle.patch horovod-tensorflow.patch)
BIN := $(VENV)/bin

# checkov (the Bicep lint of tests/unit/infra/compute/test_azure_templates.py) has its own venv: its pins (packaging<24,
# networkx<2.7, cachetools<6) conflict with the project's (pytest and wheel need packaging>=24).
TOOLS_VENV ?= .venv-tools
CHECKOV ?= checkov==3.3.30

.PHONY: setup docker-setup tools demo lint test bench device-check docs clean
# The four parts at once (the venv's install is one process; npm, apt and the tools' venv wait on the network and
# the disk meanwhile): measured from a clean clone, see the README.
SETUP_PARTS := $(VENV)/.installed node_modules/.installed docker-setup tools
setup:
	$(MAKE) --no-print-directory -j4 $(SETUP_PARTS)

# The container tests' Docker engine, registry and base-image maker, and the UI test's browser (chromium, driven
# by playwright), from Debian's packages (needs root or sudo; skipped when all are installed). The tests start
# dockerd and the registry themselves.
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
$(VENV)/.installed: pyproject.toml $(LOCK) $(TF_KERAS) $(HOROVOD_BUILD)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) $(FRAMEWORK_PINS) setuptools wheel packaging psutil cloudpickle pyyaml
	$(BIN)/pip install -q -c $(LOCK) --no-deps -r $(TF_KERAS)
	wheel=$$(containers/build/horovod-wheel.sh $(BIN)/python $(WHEEL_CACHE)) && \
	  $(BIN)/pip install -q --force-reinstall --no-deps "$$wheel" && \
	  $(BIN)/pip install -q -c $(LOCK) "$$wheel" -e '.[dev,docs]'
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

demo: setup
	$(if $(LAUNCHER),TRAINFLOW_TRAINING__LAUNCHER=$(LAUNCHER)) $(BIN)/trainflow run --config flows/configs/demo.yaml \
	  --workdir $(WORKDIR) $(if $(FRAMEWORK),--framework $(FRAMEWORK))

# The project's own checks (also run by `make test`, and before each commit by .pre-commit-config.yaml): ruff's lint
# and format, the type checker, and the import contracts of pyproject.toml (the layers of the house).
LINT_ENV := PYTHONPATH=.:containers
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(LINT_ENV) $(BIN)/mypy
	$(LINT_ENV) $(BIN)/lint-imports --no-cache

# Two test processes (pytest-xdist): while one waits on a service, a launcher or the network, the other computes.
# tests/conftest.py keeps every Docker test on one of them. TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
test: setup lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: setup
	$(BIN)/trainflow bench train --workdir $(WORKDIR) --json $(WORKDIR)/bench-train.json

# The device check (benchmarks/device_check.py): on a lent GPU machine, which has no network and no venv (so no
# `setup` first), under 7 minutes; without a GPU it checks what it can and exits 2. The venv's Python where there is one.
DEVICE_CHECK_OUT ?= $(WORKDIR)/device-check
DEVICE_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
device-check:
	PYTHONPATH=containers $(DEVICE_PYTHON) -m benchmarks.device_check --out $(DEVICE_CHECK_OUT)

# The documentation site (mkdocs.yml): the reference pages written afresh from the code (flows/reference.py), then
# the site built into site/ with --strict, as the tests build it (tests/integration/test_docs_site.py).
docs: setup
	$(BIN)/python -m flows.reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) $(TOOLS_VENV) $(WORKDIR) site
