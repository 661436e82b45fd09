# anvil_ctl — every target does its own set-up on a fresh Debian machine (as root).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEBS := docker.io haproxy tini iproute2 util-linux sqlite3 postgresql python3 chromium

.PHONY: setup debs test unit wheel-test check demo chaos bench clean

setup: $(VENV)/.installed

# Debian packages the integration tests and the demo need (dockerd, HAProxy, tini, ip, nsenter,
# the Debian python3 that stub containers bind-mount read-only, chromium, which renders the
# one-page report headless in its test and for the demo's screenshot, and PostgreSQL's server,
# the second state backend: scripts/testenv starts a server of its own, so the package is told
# not to create a system cluster).
debs:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  mkdir -p /etc/postgresql-common/createcluster.d; \
	  test -e /etc/postgresql-common/createcluster.d/anvil.conf || \
	    echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/anvil.conf; \
	  echo "installing Debian packages:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,postgres,report]'
	@# bytecode compiled once, as a wheel install does: where PYTHONDONTWRITEBYTECODE is set
	@# (as on our machines), an editable install would otherwise compile ~90 modules per command
	$(PY) -m compileall -q anvil_ctl anvil_stub scripts >/dev/null
	@touch $@

# The whole suite, unit and integration, inside hermetic environments (each its own dockerd,
# PostgreSQL and /dev/shm in a loopback-only network namespace). Integration tests fail rather
# than skip here. scripts/suite runs tests/integration in two environments at once, then the
# unit and packaging tests on every core.
test: setup debs
	ANVIL_REQUIRE_INTEGRATION=1 scripts/suite $(PY) $(PYTEST_ARGS)

# Unit tests only: no Docker, no namespace, no root.
unit: setup
	$(PY) -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

# The wheel on its own (tests/packaging, also part of `make test`): built from this checkout,
# installed non-editable into a fresh venv, and run from an empty directory: --version, init,
# recipes list/plan, a fake-backend adopt + load + rollback, status.
wheel-test: setup
	$(PY) -m pytest -p no:cacheprovider tests/packaging $(PYTEST_ARGS)

check: setup
	$(VENV)/bin/ruff format --check anvil_ctl anvil_stub tests scripts benchmarks migrations contrib/anvil-router-watch
	$(VENV)/bin/ruff check anvil_ctl anvil_stub tests scripts benchmarks migrations contrib/anvil-router-watch
	$(VENV)/bin/mypy --strict anvil_ctl anvil_stub

# Never dark, the long way: every journal boundary of load, promote and rollback killed, smg
# restarted at every boundary of promote and rollback, and 30 random-time kills per command,
# each followed by `anvilctl recover`; prints the table (dark and inconsistent must be 0).
CHAOS_SEED ?= 7
chaos: setup debs
	scripts/testenv run -- $(PY) scripts/chaos.py --seed $(CHAOS_SEED) --random 30

demo: setup debs
	scripts/demo

# Benchmarks, never timed tests: anvilctl against the bare sequence of the same parts (real
# dockerd + smg, in the hermetic environment), state databases of 1k/10k/100k real
# transactions (built once into BENCH_CACHE), the capacity gate's fidelity, and the watched
# promote (each late fault's detection and recovery, then a healthy watch of WATCH_MINUTES that
# must roll nothing back); the tables go to benchmarks/RESULTS.md. The 100k database takes ~7
# minutes to build and 0.8 GB of disk; the watch ~25 minutes plus WATCH_MINUTES.
BENCH_REPS ?= 3
WATCH_MINUTES ?= 30
SCALE_SIZES ?= 1000 10000 100000
BENCH_CACHE ?= $(HOME)/.cache/anvil/bench
bench: setup debs
	@mkdir -p benchmarks/out
	scripts/testenv run -- $(PY) benchmarks/paired.py --reps $(BENCH_REPS) --markdown-out benchmarks/out/paired.md
	$(PY) benchmarks/scale.py --sizes $(SCALE_SIZES) --cache $(BENCH_CACHE) --markdown-out benchmarks/out/scale.md
	-$(PY) benchmarks/capacity_accuracy.py --markdown-out benchmarks/out/capacity.md
	scripts/testenv run -- $(PY) benchmarks/window.py --markdown-out benchmarks/out/window.md
	scripts/testenv run -- $(PY) benchmarks/watch.py --reps $(BENCH_REPS) --healthy-minutes $(WATCH_MINUTES) \
	  --markdown-out benchmarks/out/watch.md
	$(PY) benchmarks/results.py benchmarks/out > benchmarks/RESULTS.md
	@cat benchmarks/RESULTS.md

clean:
	rm -rf $(VENV) state/anvil.db* state/anvil.lock state/evidence state/fake-world.* .mypy_cache .ruff_cache

# ---- llama.cpp engine (docs/ENGINES.md) ------------------------------------------------------
# A real engine for the integration tests: the llama-cpp-python wheel (built once, ~7-25 min,
# then reused from ~/.cache/anvil/wheels) with its pinned dependency wheels, the SmolLM2-135M
# GGUF in the hub-layout model cache (~/.cache/anvil/models), and the deterministic engine
# image built from them. Each target reuses what is there and verified.
LLAMA_BUILD_DEBS := cmake g++ make libgomp1

.PHONY: llama llama-wheel llama-model llama-image demo-real

llama: llama-wheel llama-model llama-image

# Debian's compiler and CMake only when something must be built; libgomp1 is also what the
# engine's shared libraries load from the host's bind-mounted /usr at run time.
llama-wheel: setup
	@$(PY) scripts/build_llama_wheel.py --check 2>/dev/null || { \
	  missing=""; for p in $(LLAMA_BUILD_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  fi; }
	$(PY) scripts/build_llama_wheel.py

llama-model: setup
	$(PY) scripts/fetch_model.py

llama-image: llama-wheel
	$(PY) scripts/build_llama_image.py --print-id

# `make test` builds or reuses them, so the llama integration tests find their image and model.
test: llama

# The demo's story on the real engine: llama.cpp serving SmolLM2-135M behind a real HAProxy
# (adopt, load, qualify real-small, waive the failed gates, promote, curl + openai, rollback,
# recheck, the evidence bundle). Slow on a loaded 2-core machine: prefill of 6k tokens on CPU.
demo-real: setup debs llama
	scripts/testenv run -- $(PY) scripts/demo_real.py
# ---- end llama.cpp engine ----------------------------------------------------------------------
