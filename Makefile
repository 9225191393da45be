# Quick start: `make demo` and `make test`. Both set up first (once).
VENV     := .venv
PY       := $(VENV)/bin/python
PYTHON   ?= python3
# The CPU build of torch that pip finds on this class of machine; uv is never asked for torch.
TORCH    ?= torch==2.13.0
SCENARIO ?= fx-race
WHEELS   := .cache/wheelhouse

export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup system-demo system-test lint demo demo-all test test-long serve serve-demo bench bench-fleet scale-demo

setup: $(VENV)/.installed $(WHEELS)/.complete

# Debian packages: installed when missing (as root, with apt-get), else the apt-get line to run is printed.
# Asked by the set-up's first step, by `make demo` and by `make test` (through lint); not a prerequisite of
# `setup`, so that `make -q setup` still says whether the venv is current.
system-demo:
	@scripts/system_deps.sh demo

system-test:
	@scripts/system_deps.sh test

$(VENV)/.installed: pyproject.toml
	@scripts/system_deps.sh demo
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH)' uv
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# torch and its dependencies as wheels for the demo's target venvs: filled once, read offline after.
$(WHEELS)/.complete: $(VENV)/.installed
	$(PY) -m pip download -q '$(TORCH)' numpy py-spy -d $(WHEELS)
	touch $@

demo: setup system-demo
	$(VENV)/bin/relaunch demo --scenario $(SCENARIO)

demo-all: setup
	for s in healthy missing-dependency fx-race silent-death degraded diverged broken-checkpoint corrupt-cache; do $(VENV)/bin/relaunch demo --scenario $$s || exit 1; done

# Lint first (seconds): ruff for Python, the layers contract (the core never imports upward), shellcheck for every
# script relaunch runs on a host.
lint: setup system-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/check_layers.py
	cd relaunch/host && shellcheck -x -s bash *.sh

# Four workers on two cores: most tests wait on processes, servers and sockets rather than compute;
# worksteal keeps the long tests from ending up in one worker's queue. The end-to-end runs of a whole demo or control
# plane (marked `long`: the demo scenarios, and tests/conftest.py's LONG table; minutes of CPU each) are
# `make test-long`'s, so that `make test` stays under 15 minutes on 2 cores; CI (.ci/run) runs both.
test: lint
	$(PY) -m pytest -q -n 4 --dist worksteal -m "not long" --durations=25

# Two workers: each end-to-end run gets a core; at three, a demo's broken run did not reach its crash within 240 s.
test-long: setup system-test
	$(PY) -m pytest -q -n 2 --dist worksteal -m long --durations=10

# A local control plane: Prefect server (SQLite), work pool, automations, a worker; no demo. Ctrl-C stops it all.
# Your targets go on it with `relaunch deploy TARGET.yaml`.
serve: setup
	scripts/serve.sh

# The same, with prefect.yaml's demo deployments (a demo trainer recovered on demand, and checked every night).
serve-demo: setup
	SERVE_DEMO=1 scripts/serve.sh

# CPU benchmarks, each kept in bench/results/NAME.json (bench/record.py); about an hour on 2 cores (overhead alone ~45 min: 4 contenders, 5 rounds, 2 cases).
# The GPU side runs on the GPU machine, not here: bash bench/gpu_demo/run.sh OUT (see its header).
bench: setup
	$(PY) bench/record.py detection_latency -- $(PY) bench/detection_latency.py
	$(PY) bench/record.py check_time -- $(PY) bench/check_time.py
	$(PY) bench/record.py overhead -- $(PY) bench/overhead.py
	$(PY) bench/record.py warmup_efficacy_cpu -- $(PY) bench/warmup_efficacy.py --device cpu
	$(PY) bench/record.py recover_breakdown_cpu -- $(PY) bench/recover_breakdown.py --device cpu

bench-fleet: setup
	$(PY) bench/fleet_checks.py

# The fleet check at scale on this machine: PostgreSQL, Redis, a Prefect server on them (API auth on), two workers and
# SSH hosts in network namespaces (root), some broken; prints one JSON line. `make scale-demo HOSTS=16 BROKEN=4`.
scale-demo: setup
	$(PY) scripts/scale_demo.py --hosts $(or $(HOSTS),8) --broken $(or $(BROKEN),2)
