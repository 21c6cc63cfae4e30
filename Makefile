# django-leader developer entry point. `make help` lists the targets.
#
#   make venv    .venv with the package (editable) and the dev tools
#   make test    the test suite against SQLite, and PostgreSQL / MariaDB when reachable
#   make chaos-short  the short seeded chaos runs (CI runs them after make test)
#   make newcomer     the docs followed in a fresh virtualenv (CI runs them too)
#   make topologies   only the failovers of replicated stores the tests start (in make test)
#   make lint    ruff (rules and format), mypy (package and tests), makemigrations --check
#   make docs    the Sphinx documentation in docs/_build/html (warnings are errors)
#   make dist    the sdist and the wheel in dist/, checked with twine check --strict
#   make demo    election, crash, takeover and shutdown of three processes (SQLite only)
#   make chaos   the fault-injection suite, a long seeded run per store, report in docs/chaos/
#   make compat  the core tests on Django 4.2 (Python 3.10), 5.2 (3.12) and 6 (3.13),
#                each in a venv of its own, where those interpreters exist
#   make bench   the benchmarks of bench/ against the peers, written to docs/benchmarks.md
#                with plots (about 12 minutes, in .venv-bench); not in CI
#
# Variables: PYTHON (the interpreter that creates .venv, default python3),
# PYTEST_ARGS (passed to pytest, e.g. PYTEST_ARGS="-k conformance -x"), TEST_WORKERS (make
# test's parallel pytest processes, default 4; 0 for one), COVERAGE=1 (make test
# with a branch-coverage report of django_leader/),
# STORES, DURATION and SEED (make chaos: which stores, seconds of faults each, the seed),
# BENCH and BENCH_ARGS (make bench: which parts of bench/report.py, and its options).

PYTHON ?= python3
PYTEST_ARGS ?=
STORES ?= sqlite postgresql mariadb redis zookeeper
DURATION ?= 600
SEED ?= 1

VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; older than pyproject.toml means "install again".
STAMP := $(VENV)/.installed
MYSQLCLIENT_LOG := $(VENV)/mysqlclient-install.log

.DEFAULT_GOAL := help
.PHONY: help venv test chaos-short newcomer topologies lint docs dist demo chaos chaos-failovers compat compat-one bench clean distclean

help:
	@echo "make venv       create .venv and install django-leader[dev] (editable)"
	@echo "make test       run the test suite (PYTEST_ARGS=... passes options to pytest)"
	@echo "make chaos-short  the short seeded chaos runs of CI (tests marked chaos, about 6 min)"
	@echo "make newcomer   the docs followed in a fresh venv (tests marked newcomer, about 3 min)"
	@echo "make topologies only make test's failovers of the replicated stores it starts (about 2 min)"
	@echo "make lint       ruff check and format, mypy, makemigrations --check"
	@echo "make docs       build the documentation into docs/_build/html (warnings are errors)"
	@echo "make dist       build the sdist and the wheel into dist/ and check them with twine"
	@echo "make demo       leader election demo with three processes (SQLite, no services)"
	@echo "make chaos      fault injection per store (STORES=..., DURATION=600, SEED=1); report in docs/chaos/"
	@echo "make chaos-failovers  the replicated stores, failovers only (DURATION_FAILOVERS=420)"
	@echo "make compat     core tests on Django 4.2 / Python 3.10, 5.2 / 3.12, 6 / 3.13"
	@echo "make bench      benchmarks and docs/benchmarks.md (BENCH=\"ops failover celery load scale\", BENCH_ARGS=...), ~12 min"
	@echo "make clean      remove caches, build output and .demo/"
	@echo "make distclean  clean, and remove .venv too"

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@# mysqlclient is built from source: it needs a C compiler, the Python headers,
	@# pkg-config and the MariaDB/MySQL client headers (Debian: libmariadb-dev).
	@if $(BIN)/python -m pip install --quiet mysqlclient >$(MYSQLCLIENT_LOG) 2>&1; then \
		echo "mysqlclient installed: the MariaDB tests can run"; \
	else \
		echo "NOTE: could not install mysqlclient (see $(MYSQLCLIENT_LOG)): the MariaDB tests"; \
		echo "      will be skipped. Install gcc, pkg-config and libmariadb-dev, then run"; \
		echo "      'rm $(STAMP) && make venv' to try again."; \
	fi
	@touch $@

# COVERAGE=1 (set by CI) adds a branch-coverage report of django_leader/ to the run; code
# that runs only in child processes (runleader's guard, Celery workers) is not counted:
# measuring them too (coverage's patch = ["subprocess"]) costs CI about 150 s.
COVERAGE ?=
COVERAGE_ARGS := $(if $(COVERAGE),--cov=django_leader --cov-branch --cov-report=term-missing:skip-covered)

# TEST_WORKERS: pytest-xdist processes (0: one process). Most tests wait on leases, stores
# and child processes rather than compute (with six workers the suite keeps two cores
# about 60 % busy), so six workers on two cores finish sooner: 792 s with the seeded
# failover runs, where five took 797 s without them (28 Nov 2026; earlier, 558 s with
# five against 642 s with four); tests that must not overlap share one worker
# (xdist_group, --dist loadgroup).
# Each worker has its own test databases and Redis databases (testproject/services.py).
TEST_WORKERS ?= 6

# The seeded chaos runs (marked chaos: eight runs of 30-40 s, one after the other, for
# their liveness bound wants the cores) are left out: make chaos-short runs them, and CI
# runs both. So are the tests marked newcomer (make newcomer, below).
test: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not chaos and not newcomer" $(COVERAGE_ARGS) $(PYTEST_ARGS)

# The pages followed as a newcomer would (tests/processes/test_tutorial.py, marked newcomer):
# the distributions built and checked, a fresh virtualenv from the package index, new
# projects, the tutorial, the how-tos and the README's Quickstart. Apart from make test
# (which they took past 15 minutes on two cores: building and installing compete with the
# suite for the cores); CI runs both. About 3 minutes.
newcomer: venv
	$(BIN)/python -m pytest -n 3 --dist loadgroup -m newcomer tests/processes/test_tutorial.py $(PYTEST_ARGS)

# Only the tests of make test that start replicated or clustered stores of their own and
# fail them over (marked topology): PostgreSQL standbys (async, sync, behind PgBouncer),
# Redis Sentinel and Cluster, ZooKeeper ensembles and their restores. About 2 minutes.
topologies: venv
	$(BIN)/python -m pytest -n 3 --dist loadgroup -m topology tests/contract tests/processes $(PYTEST_ARGS)

chaos-short: venv
	$(BIN)/python -m pytest -m chaos tests/processes/test_chaos.py $(PYTEST_ARGS)

# Every check runs even if an earlier one fails, so one pass shows every problem: ruff's
# lint rules and format, mypy over django_leader/ and tests/, the import contracts of
# django_leader/ (its layers, no import circle: [tool.importlinter] in pyproject.toml), and
# no model change without its migration. The same checks run as pre-commit hooks
# (.pre-commit-config.yaml).
lint: venv
	@status=0; \
	echo "$(BIN)/ruff check ."; $(BIN)/ruff check . || status=1; \
	echo "$(BIN)/ruff format --check ."; $(BIN)/ruff format --check . || status=1; \
	echo "$(BIN)/mypy"; $(BIN)/mypy || status=1; \
	echo "$(BIN)/lint-imports"; $(BIN)/lint-imports --no-cache || status=1; \
	echo "makemigrations --check"; \
	$(BIN)/python -m django makemigrations --check --dry-run --skip-checks --settings=testproject.settings \
		django_leader || status=1; \
	echo "no database file tracked"; \
	tracked=$$(git ls-files 2>/dev/null | grep -E '\.(sqlite3?|db)(-journal|-wal|-shm)?$$|\.sqlite3_gw[0-9]+$$|\.rdb$$'); \
	if [ -n "$$tracked" ]; then echo "database files tracked by git: $$tracked"; status=1; fi; \
	exit $$status

# -E: read every page again, so that a page's warnings are reported on every build, not
# only on the first one after it changed.
docs: venv
	$(BIN)/sphinx-build -E -W --keep-going -b html docs docs/_build/html

# What a release would upload, and what the README says to install before the first one:
# python -m build makes the sdist, then the wheel from the sdist (so a file missing from the
# sdist is missing from the wheel too); twine checks their metadata and that the README
# renders. tests/processes/test_tutorial.py builds them the same way and installs the wheel.
# In a virtualenv of its own with build and twine only: a wheel needs none of the dev
# toolchain (pytest, mypy, sphinx, playwright) that make venv installs.
DIST_VENV := .venv-dist
dist:
	test -x $(DIST_VENV)/bin/python || $(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip install --quiet --upgrade pip build twine
	rm -rf dist
	$(DIST_VENV)/bin/python -m build --outdir dist .
	$(DIST_VENV)/bin/twine check --strict dist/*

# One seeded run per store against a private instance of it; each writes
# docs/chaos/<store>.md, .json and .png. Every store runs even if an earlier one failed.
chaos: venv
	@status=0; for store in $(STORES); do \
		$(BIN)/python -m tests.chaos --store $$store --duration $(DURATION) --seed $(SEED) \
			--report docs/chaos/ || status=1; \
	done; exit $$status

# The replicated stores (tests/chaos/replicated.py) with their failovers as the only
# faults, DURATION_FAILOVERS seconds each (420: 30 or more failovers per store); reports in
# docs/chaos/. CHAOS_SENTINEL_WAIT=0 (CHAOS_CLUSTER_WAIT=0) runs the Sentinel (Cluster)
# candidates without REDIS_WAIT_REPLICAS.
FAILOVER_STORES ?= redis-sentinel redis-cluster postgresql-standby postgresql-sync \
	postgresql-pgbouncer
DURATION_FAILOVERS ?= 420
chaos-failovers: venv
	@status=0; for store in $(FAILOVER_STORES); do \
		$(BIN)/python -m tests.chaos --store $$store --faults store \
			--duration $(DURATION_FAILOVERS) --seed $(SEED) --report docs/chaos/ || status=1; \
	done; exit $$status

# Other Django versions: the store-facing core (conformance, lease, settings, lock, health
# and metrics, asyncio), the times with USE_TZ = False and the admin (which follows Django's
# own templates), on the interpreters pyenv or the system provides; a missing one is skipped.
# APScheduler, huey, RQ and redis-py (with django-redis 5): their oldest supported releases
# (3.9, 2.5, 2.7, 4.5) beside Django 4.2, their newest beside the others (APS, HUEY, RQ,
# REDIS).
COMPAT_TESTS := tests/contract/test_conformance.py tests/unit/test_lease.py tests/unit/test_conf.py \
	tests/components/test_lock.py tests/components/test_observability.py tests/components/test_async.py \
	tests/components/test_apscheduler.py tests/components/test_huey.py tests/components/test_rq.py \
	tests/contract/test_local_time_zone.py tests/components/test_admin.py \
	tests/components/test_admin_local_times.py tests/contract/test_redis_calls.py
REDIS ?= redis django-redis
COMPAT_DEPS := pytest pytest-django "psycopg[binary]" $(REDIS) time-machine \
	prometheus-client kazoo
APS ?= APScheduler>=3.9,<4
HUEY ?= huey>=2.5
RQ ?= rq>=2.7
# pyenv's own interpreters first: its shims on PATH may refuse to run an inactive version.
PY310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python) $(shell command -v python3.10))
PY312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python) $(shell command -v python3.12))
PY313 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python) $(shell command -v python3.13))

# Every Python the classifiers name runs somewhere: 3.11 in make test, 3.10 with Django
# 4.2, 3.12 with Django 5.2, 3.13 with Django 6. The three run side by side, each logging
# to a file shown when all ended.
compat:
	@$(MAKE) --no-print-directory compat-one PY="$(PY310)" DJANGO="Django>=4.2,<5" \
		APS="APScheduler==3.9.1.post1" HUEY="huey==2.5.0" RQ="rq==2.7.0" \
		REDIS='"redis==4.5.5" "django-redis>=5.4,<6"' NAME=django42 >.compat-django42.log 2>&1 & first=$$!; \
	$(MAKE) --no-print-directory compat-one PY="$(PY312)" DJANGO="Django>=5.2,<6" \
		NAME=django52 >.compat-django52.log 2>&1 & second=$$!; \
	$(MAKE) --no-print-directory compat-one PY="$(PY313)" DJANGO="Django>=6.0,<7" \
		NAME=django6 >.compat-django6.log 2>&1 & third=$$!; \
	status=0; wait $$first || status=1; wait $$second || status=1; wait $$third || status=1; \
	cat .compat-django42.log .compat-django52.log .compat-django6.log; exit $$status

compat-one:
	@if [ -z "$(PY)" ]; then echo "compat $(NAME): no suitable Python here, skipped"; exit 0; fi; \
	set -e; \
	test -x .venv-$(NAME)/bin/python || $(PY) -m venv .venv-$(NAME); \
	.venv-$(NAME)/bin/python -m pip install --quiet --upgrade pip; \
	.venv-$(NAME)/bin/python -m pip install --quiet -e . "$(DJANGO)" "$(APS)" "$(HUEY)" "$(RQ)" $(COMPAT_DEPS); \
	.venv-$(NAME)/bin/python -m pip install --quiet mysqlclient || true; \
	echo "compat $(NAME): $$(.venv-$(NAME)/bin/python -c 'import sys, django, apscheduler, huey, rq, redis; print("Python", sys.version.split()[0], "Django", django.get_version(), "APScheduler", apscheduler.__version__, "huey", huey.__version__, "RQ", rq.__version__, "redis-py", redis.__version__)')"; \
	.venv-$(NAME)/bin/python -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) $(PYTEST_ARGS)

demo: venv
	$(BIN)/python -m testproject.demo

# The benchmarks (docs/benchmarks.md): bench/report.py runs its parts and writes the page
# and its plots (docs/benchmarks/). BENCH names the parts (default: all of them, about 12
# minutes; e.g. BENCH="ops scale": the other parts keep their last results), BENCH_ARGS
# passes options (bench/report.py --help). It runs in .venv-bench, a virtualenv of its own
# with this package (editable), the drivers and the peers it is measured against, from
# PyPI; .venv stays as it is. Not part of CI: the numbers need a machine at rest.
BENCH ?= all
BENCH_ARGS ?=
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_DEPS := "psycopg[binary]>=3.1" "redis>=4.5" "django-redis>=5.4" "kazoo>=2.9" \
	"celery[redis]>=5.3" "matplotlib>=3.7" pytest \
	celery-redbeat single-beat python-redis-lock celery-singleton

$(BENCH_STAMP): pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e . $(BENCH_DEPS)
	@# MariaDB's driver is built from source (see venv above): without it, no MariaDB numbers.
	$(BENCH_VENV)/bin/python -m pip install --quiet mysqlclient || \
		echo "NOTE: mysqlclient not installed: the bench will leave MariaDB out"
	@touch $@

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/report.py --parts "$(BENCH)" $(BENCH_ARGS)

clean:
	rm -rf .demo build dist docs/_build .pytest_cache .mypy_cache .ruff_cache *.egg-info \
		.compat-*.log
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .venv-django42 .venv-django52 .venv-django6 $(DIST_VENV) $(BENCH_VENV)
