# The two commands a newcomer needs:  make demo  and  make test.  Everything else is a step of those.
# Each target sets up what it needs on a fresh machine: the virtualenv from the pinned set, the local
# control plane and the real programs run beside the operators (MetalLB's controller, Jaeger,
# promtool, Helm), all built from Go modules and cached under ~/.cache/cozystack-operators.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

TOOLS  := metallb jaeger promtool helm

.PHONY: help venv controlplane tools image lint unit integration test demo bench cluster cluster-down lock clean

help:
	@echo "make test          lint + unit + integration tests (builds what it needs)"
	@echo "make demo          both operators on the local control plane with sample objects"
	@echo "make bench         benchmarks, each with a ratio against a baseline from the same run"
	@echo "make image         build the operators' image here, with no registry (podman/buildah, as root)"
	@echo "make cluster       start the local control plane in the background (.devcluster/kubeconfig)"
	@echo "make cluster-down  stop it"

$(STAMP): pyproject.toml requirements.lock
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

venv: $(STAMP)

controlplane:
	@hack/build-controlplane.sh >/dev/null

# Each is built once per pin (hack/tools/<name>/go.mod); an unchanged pin costs one hash.
tools:
	@for tool in $(TOOLS); do hack/build-tool.sh $$tool >/dev/null || exit 1; done

# The operators' image on a Debian base built from Debian's packages (no registry needed); prints the
# local tag. Needs podman, buildah, runc and debootstrap (.ci/run installs them).
image:
	@hack/build-image.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The chart check (tests/unit/test_charts_current.py) renders config/ with the control plane's kubectl.
unit: venv controlplane
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: venv controlplane tools
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test: lint controlplane tools
	$(PY) -m pytest tests $(PYTEST_ARGS)

demo: venv controlplane tools
	$(PY) -m hack.demo

bench: venv controlplane tools
	$(PY) -m bench

cluster: controlplane
	@hack/cluster.sh up

cluster-down:
	@hack/cluster.sh down

# Re-pin the whole set after changing pyproject.toml (resolves in a throwaway virtualenv).
lock:
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/pip install --quiet --upgrade pip && .lockenv/bin/pip install --quiet -e '.[dev]'
	{ echo "# The whole pinned set (runtime + dev), installed by 'make venv'. Regenerate with 'make lock'."; \
	  .lockenv/bin/pip freeze --exclude-editable; } > requirements.lock
	rm -rf .lockenv

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
