# ml-dev-env — offline render, tests and benchmarks. Everything installs itself (venv, pip, apt).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= barcelona
# Debian packages the tests and benchmarks use for real (registry, skopeo, buildah, htpasswd).
APT_PACKAGES := docker-registry skopeo buildah apache2-utils
REQUIREMENTS := requirements.txt requirements-dev.txt $(wildcard steps/requirements.txt steps/requirements-test.txt)

.PHONY: help venv system-deps render render-all runs test lint docs diagram policy-preview bench-package clean

help:
	@echo "make render STACK=<name>   render one stack offline into rendered/<name>/ (+ schema check)"
	@echo "make render-all            render every Pulumi.<stack>.yaml"
	@echo "make runs STACK=<name>     state of each model's packaging run (needs oc, logged in)"
	@echo "make test                  lint + the whole test suite (installs what it needs)"
	@echo "make docs                  regenerate the configuration reference, presets and diagram in README.md"
	@echo "make policy-preview        pulumi preview with the policy pack (needs the Pulumi CLI and a cluster)"
	@echo "make bench-package         modelcar packaging benchmark (SIZE=2GiB)"

$(VENV)/.installed: $(REQUIREMENTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(foreach r,$(filter-out requirements.txt,$(REQUIREMENTS)),-r $(r))
	touch $@

venv: $(VENV)/.installed

# Installs the Debian packages when one is missing (needs root, as in CI).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

render: venv
	$(PY) tools/render.py $(STACK)

render-all: venv
	$(PY) tools/render.py

runs: venv
	$(PY) tools/runs.py $(STACK)

lint: venv
	$(PY) -m ruff check .

docs: venv
	$(PY) tools/config_reference.py --write README.md
	$(PY) tools/diagram.py --write README.md

diagram: venv
	$(PY) tools/diagram.py $(STACK)

policy-preview: venv
	pulumi preview --stack $(STACK) --policy-pack policy --diff

test: venv system-deps lint
	$(PY) -m pytest -q

bench-package: venv system-deps
	$(PY) bench/bench_package.py --size $(or $(SIZE),2GiB)

clean:
	rm -rf rendered .pytest_cache .ruff_cache
