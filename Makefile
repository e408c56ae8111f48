# Python Endpoint Picker. `make help` lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HELM := $(BIN)/helm

.DEFAULT_GOAL := help
.PHONY: help install demo test test-unit test-e2e test-fuzz check proto bench bench-quick clean

help: ## show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

# The modules mypyc compiles, read from hatch_build.py's COMPILED_MODULES (one list): editing one
# rebuilds it, or tests/test_compiled.py would tell of a stale build that install calls up to date.
COMPILED := $(shell sed -n '/^COMPILED_MODULES = (/,/^)/s/.*Path("\(.*\)").*/\1/p' hatch_build.py)

$(STAMP): pyproject.toml sim/pyproject.toml kubeapi/pyproject.toml hatch_build.py protos/gen_envoy_stubs.py src/epp/director/prefix/_native.c src/epp/server/_incoming.c src/epp/scheduling/_kernel.c $(COMPILED)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./sim -e ./kubeapi
	$(BIN)/pip check
	@touch $(STAMP)

# A real helm for the chart's tests, verified; offline, a missing one makes those tests fail, not install.
$(HELM): deploy/helm/fetch_helm.py | $(STAMP)
	$(BIN)/python deploy/helm/fetch_helm.py $(HELM) || echo "WARNING: no helm, so the helm tests in tests/deploy will fail"

install: $(STAMP) $(HELM) ## create .venv in the repo; install the EPP with its dev tools, the simulator (sim/) and helm

demo: $(STAMP) ## run simulated model servers + EPP + Envoy, send a burst of requests, print a summary
	$(BIN)/python -m epp_sim.demo

# Two xdist workers: one runs the e2e and `serial` tests (real processes, wall-clock bounds) one
# after another from the start, the other the unit tests (tests/serial_tail.py).
XDIST := -n 2
PYTEST_ARGS ?=  # e.g. make test PYTEST_ARGS=--durations=15

test: $(STAMP) $(HELM) ## run the whole test suite (unit, contract and end-to-end through Envoy)
	$(BIN)/pytest -q $(XDIST) $(PYTEST_ARGS)

test-unit: $(STAMP) $(HELM) ## run the fast tests only (no Envoy)
	$(BIN)/pytest -q $(XDIST) -m "not e2e" $(PYTEST_ARGS)

test-e2e: $(STAMP) ## run the end-to-end tests through a real Envoy
	$(BIN)/pytest -q -m e2e

test-fuzz: $(STAMP) ## the long hypothesis runs (differential, property and HTTP/2 frame fuzz), minutes each
	$(BIN)/pytest -q -m fuzz

check: $(STAMP) ## lint, format, types, architecture contracts
	$(BIN)/ruff format --check src sim kubeapi tests bench
	$(BIN)/ruff check src sim kubeapi tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

proto: $(STAMP) ## regenerate the private Envoy ext_proc stubs (also done at install)
	$(BIN)/pip install --quiet 'xds-protos>=1.85,<1.86' 'grpcio-tools>=1.85,<1.86'
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/protos/gen_envoy_stubs.py $(CURDIR)/src
	$(BIN)/pip uninstall --quiet -y xds-protos grpcio-tools

bench: $(STAMP) ## full benchmarks; writes bench/results/*.json and bench/REPORT.md
	$(BIN)/python -m bench.run --mode full

bench-quick: $(STAMP) ## quick smoke run of every benchmark
	$(BIN)/python -m bench.run --mode quick

clean: ## remove the venv and build artefacts
	rm -rf $(VENV) build dist sim/build sim/dist src/epp/_pb .pytest_cache .mypy_cache .ruff_cache
