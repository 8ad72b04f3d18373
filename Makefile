# The two commands a newcomer needs: `make run` and `make test` (see README.md and docs/running.md).
# Everything runs from the project's own virtual environment in .venv, made when missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Re-installs only when a pyproject.toml is newer than the last install (the code itself is
# installed in editable mode, so edits need no re-install). The Python client and its
# `gpu-portal` CLI are their own package (clients/python), installed beside the portal.
INSTALLED := $(VENV)/.portal-installed
CLIENT := clients/python
# Extra arguments: `make run ARGS="--port 9000 --agents 2"`, `make test PYTEST_ARGS="-k e2e"`.
ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help run test lint format bench bench-full bench-pages bench-api clean distclean install chromium dockerd iproute2 wrk
.PHONY: chaos chaos-short chaos-recovery test-deep

help:
	@echo "make run    - install, migrate, seed demo data and start the portal on http://127.0.0.1:8000"
	@echo "make test   - install and run the whole suite (ruff, mypy --strict scheduler workers, pytest)"
	@echo "make test-deep - the property tests with random seeds and 10x the examples (hunting)"
	@echo "make lint   - ruff check, ruff format --check, mypy --strict scheduler workers"
	@echo "make format - ruff format and ruff check --fix"
	@echo "make bench  - the benchmarks into bench/results.json: core pass, Philly and own traces,"
	@echo "              durations shown and hidden (replays in parallel; target: 25 min on 2"
	@echo "              cores, 13.9-22.4 min on 7 Dec 2026); bench-full: also plain FIFO on Philly"
	@echo "make bench-pages - each page's render time and queries on 1,000 nodes and 10,000+ jobs (~10 min)"
	@echo "make bench-api - the API's req/s and p50/p99 (wrk) and admissions/s, on PostgreSQL + Redis"
	@echo "make chaos  - the chaos harness, 1000 faults (about an hour; needs root); chaos-short: 20;"
	@echo "              chaos-recovery: agent faults only, the recovery-time figures (12 min)"
	@echo "make clean  - remove caches and .var (the SQLite database); distclean also .venv"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml $(CLIENT)/pyproject.toml | $(PY)
	@echo "installing the portal, its client and its dev tools into $(VENV) ..."
	$(PY) -m pip install --disable-pip-version-check --quiet -e '.[dev]' -e ./$(CLIENT)
	@touch $@

# The client's dependency wheels, for the test that installs it into a clean venv offline.
WHEELHOUSE := .var/client-wheelhouse/.complete

$(WHEELHOUSE): $(CLIENT)/pyproject.toml | $(INSTALLED)
	@PY=$(PY) bash scripts/client-wheelhouse.sh

install: $(INSTALLED) $(WHEELHOUSE)

run: $(INSTALLED)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py runportal $(ARGS)

chromium:
	@bash scripts/ensure-chromium.sh

dockerd:
	@bash scripts/ensure-dockerd.sh

iproute2:
	@bash scripts/ensure-iproute2.sh

test: $(INSTALLED) $(WHEELHOUSE) chromium dockerd iproute2
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict scheduler workers
	@# pytest exits 5 when it collected no test: that is a broken suite, never a pass.
	@$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no test (exit 5)" >&2; fi; \
	exit $$rc

# `make test` runs the property tests on fixed examples (hypothesis profile `ci`); this hunts.
test-deep: $(INSTALLED)
	HYPOTHESIS_PROFILE=deep $(VENV)/bin/pytest tests/scheduler $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict scheduler workers

format: $(INSTALLED)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The replays run in parallel, one process per replay (bench/philly.py).
bench: $(INSTALLED)
	$(PY) -m bench $(ARGS)

bench-full: $(INSTALLED)
	$(PY) -m bench --full $(ARGS)

# Not part of `make bench`: building its world (1,000 nodes, 23,000 jobs) takes minutes.
bench-pages: $(INSTALLED)
	$(PY) -m bench.pages --json bench/pages.json $(ARGS)

wrk:
	@bash scripts/ensure-wrk.sh

# Needs DATABASE_URL (PostgreSQL) and REDIS_URL; writes the "api" key of bench/results.json.
bench-api: $(INSTALLED) wrk
	$(PY) -m bench.api $(ARGS)

# The chaos harness (tests/chaos): a private PostgreSQL and Redis, the whole portal, seeded
# faults, then checks against what really ran. Needs root. `make chaos SEED=3 ARGS="--agents 4"`.
SEED ?= 1
chaos: $(INSTALLED)
	@echo "make chaos: 1000 faults, one every 2-5 s: about 60 min, plus ~1 min start and up to 4 min settling"
	$(PY) -m tests.chaos --faults 1000 --jobs 600 --agents 4 --seed $(SEED) --out test-results/chaos.json $(ARGS)

chaos-short: $(INSTALLED)
	@echo "make chaos-short: 20 faults: about 3 min"
	$(PY) -m tests.chaos --faults 20 --jobs 30 --seed $(SEED) --out test-results/chaos-short.json $(ARGS)

# Recovery times where the targets apply: agent kills and pauses only, with spare capacity.
chaos-recovery: $(INSTALLED)
	@echo "make chaos-recovery: 24 agent faults, one every 20-30 s: about 12 min"
	$(PY) -m tests.chaos --faults 24 --jobs 30 --agents 3 --seed $(SEED) --interval 20,30 \
		--job-seconds 40,80 --out test-results/chaos-recovery.json $(ARGS) \
		--weights kill_worker=0,kill_lease=0,kill_beat=0,kill_web=0,restart_redis=0,restart_postgres=0,drop_message=0,duplicate_message=0

clean:
	rm -rf .var .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info test-results
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
