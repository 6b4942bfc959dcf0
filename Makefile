# The README names these targets. Every target runs the idempotent set-up first,
# so each one works on a fresh clone.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
KDQ := $(VENV)/bin/kdq
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup run stop status test test-unit test-integration lint package

setup:
	@bash scripts/setup.sh

## run: start the product locally on the embedded default
run: setup
	@$(KDQ) up
	@$(KDQ) stream --detach
	@echo "Next: .venv/bin/kdq status   |   .venv/bin/kdq sql \"SELECT * FROM kdq.window_counts LIMIT 20\"   |   make stop"

## stop: stop everything `make run` started
stop:
	@$(KDQ) down

status:
	@$(KDQ) status

## test: every test suite (unit, DAG integrity, integration with real services)
test: setup
	@$(PY) -m pytest tests -q

test-unit: setup
	@$(PY) -m pytest tests/unit -q

test-integration: setup
	@$(PY) -m pytest tests/integration -q

lint: setup
	@$(VENV)/bin/ruff check include plugins dags spark_jobs tests

## package: dist/kdq.zip, the shared package for spark-submit --py-files on a cluster
package: setup
	@mkdir -p dist && $(PY) -c "import pathlib, zipfile; \
	  z = zipfile.ZipFile('dist/kdq.zip', 'w', zipfile.ZIP_DEFLATED); \
	  [z.write(p, p.relative_to('include')) for p in sorted(pathlib.Path('include/kdq').rglob('*')) if p.suffix in ('.py', '.typed')]; \
	  z.close()" && echo "dist/kdq.zip"
