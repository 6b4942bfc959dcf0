# The README names these targets. Every target runs the idempotent set-up first,
# so each one works on a fresh clone.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
KDQ := $(VENV)/bin/kdq
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup setup-s3 run stop status test test-slow test-all test-unit test-integration test-cluster lint package bench bench-quick bench-sweep chaos chaos-s3

setup:
	@bash scripts/setup.sh

## setup-s3: the set-up plus the S3A connector (hadoop-aws, AWS SDK modules) for tables and checkpoints on
## s3a:// (paths.storage_uri; docs/cluster.md), into .cache/jars/hadoop-aws
setup-s3:
	@KDQ_SETUP_S3=1 bash scripts/setup.sh

## run: the whole product locally: Kafka, InfluxDB, Airflow standalone (UI), the speed layer started by
## its supervisor DAG, demo traffic. Stays in the foreground; Ctrl-C (or `make stop`) stops everything.
## Demo options: make run DEMO="--rate 200 --late 0.05"
## On the cluster shape (3 Kafka brokers at RF 3, a Spark standalone master with 2 workers running the stream,
## the SQL endpoint and Airflow's jobs; docs/cluster.md): make run CLUSTER=1
DEMO ?=
CLUSTER ?=
run: setup
	@$(KDQ) run --demo-args="$(DEMO)"$(if $(CLUSTER), --cluster)

## stop: stop everything `make run` started (demo traffic, Airflow, the stream, InfluxDB, Kafka)
stop:
	@$(KDQ) down

status:
	@$(KDQ) status

## test: every test suite (unit, DAG integrity, integration with real services) but the cluster and slow ones
## (what CI runs, within its time budget)
test: setup
	@$(PY) -m pytest tests -q -m "not cluster and not slow" --durations=30

## test-slow: the longest local tests, on demand (Airflow standalone: a backfill through the scheduler, the UI, the
## secrets of task logs, the data-quality page in headless Chromium; the stream killed at every crash point)
test-slow: setup
	@$(PY) -m pytest tests -q -m "slow and not cluster" --durations=30

## test-all: make test and make test-slow in one session
test-all: setup
	@$(PY) -m pytest tests -q -m "not cluster" --durations=30

test-unit: setup
	@$(PY) -m pytest tests/unit -q

## test-integration: the integration tests of `make test` (the cluster-shaped ones: `make test-cluster`; the slow
## ones: `make test-slow`)
test-integration: setup
	@$(PY) -m pytest tests/integration -q -m "not cluster and not slow"

## test-cluster: the cluster shape of the stack (3 Kafka brokers at RF 3, Spark standalone master + 2 workers;
## docs/cluster.md): the seed example, then the hourly recompute and a rebuild, submitted to the master; a
## broker killed mid-stream; a worker killed mid-batch of a 100k-record run (test_cluster.py); the whole product
## (kdq run --cluster, test_cluster_product.py); tables and checkpoints on s3a:// with concurrent writers (S3 and
## DynamoDB on loopback, test_cluster_s3.py, test_s3_concurrent_writers.py). Every test marked `cluster`:
## 18 tests (16 measured together in 34.5 min on the quiet machine; +2 for the DynamoDB log store) (docs/cluster.md "Tests").
## On demand, not part of `make test` (CI's time budget); its results are in docs/cluster.md.
test-cluster: setup-s3
	@$(PY) -m pytest tests/integration -q -m cluster -s

## bench: the benchmark (own local stack on free ports; ~9 min at the default size); results in benchmarks/results/
bench: setup
	@$(PY) -m benchmarks

bench-quick: setup
	@$(PY) -m benchmarks --quick

## bench-avro: issue 28's Avro variant: the orders workload once as JSON (the orders rule) and once as ≈ 1 KB Avro in
## Confluent's wire format through the Schema Registry the harness starts (a registry = true rule), catch-up only,
## compared in the same run (~4 min at the default size, quiet). Results in benchmarks/results/avro.{json,md,png}.
## Smaller: make bench-avro BENCH_AVRO="--quick"
.PHONY: bench-avro
BENCH_AVRO ?=
bench-avro: setup
	@$(PY) -m benchmarks --rule-variants avro --phases throughput --no-kstreams --name avro $(BENCH_AVRO)

## bench-cluster: the speed layer of `make bench` (same workload) on the cluster shape (`kdq up --cluster`: 3 Kafka
## brokers at RF 3, the stream submitted to a Spark standalone master with two 1-core workers) beside local[2], one
## shape after the other; not part of `make bench`. Results in benchmarks/results/cluster.{json,md}; a quiet machine only.
## Smaller: make bench-cluster BENCH_CLUSTER="--quick" (python -m benchmarks.cluster --help)
.PHONY: bench-cluster
BENCH_CLUSTER ?=
bench-cluster: setup
	@$(PY) -m benchmarks.cluster $(BENCH_CLUSTER)

## bench-local-run: `make run` measured (issue 25): the product on a private data folder and free ports with the demo
## traffic, a quiet phase, then one with the daily maintenance and an hourly recompute triggered; the data-quality
## page's first paint and numbers, SQL through Spark Connect, JDBC and `kdq sql`, the stream's batch duration and
## produce -> visible, the machine's load (~15 min at the default 4 min per phase). Results in
## benchmarks/results/local_run.{json,md}; options: make bench-local-run LOCAL_RUN="--minutes 3 --demo-args='--rate 200'"
.PHONY: bench-local-run
LOCAL_RUN ?=
bench-local-run: setup
	@$(PY) -m benchmarks.local_run $(LOCAL_RUN)

## bench-soak: issue 24's soak run: the speed layer for 2 hours at 5,000 msgs/s (make bench's 1 KB orders) started by
## its supervisor DAG, with kdq_hourly_recompute running as scheduled beside it; per 10 minutes the batches' fixed
## cost, produce -> visible p50/p99, the stream's cores and RSS, and whether they stay flat from the first hour to
## the last; exactness checked at the end. Results in benchmarks/results/soak.{json,md}; a quiet machine only.
## Shorter: make bench-soak SOAK="--minutes 30 --rate 1000" (python -m benchmarks.soak --help)
.PHONY: bench-soak
SOAK ?=
bench-soak: setup
	@$(PY) -m benchmarks.soak $(SOAK)

## bench-sweep: one stream setting changed per run (~40 min); results in benchmarks/results/sweep.{json,md}
bench-sweep: setup
	@$(PY) -m benchmarks.sweep

## chaos: the chaos run of issues 13 and 23 (not part of `make test`/CI): its own stack on free ports, ~20 min
## of valid/invalid/late/poison traffic (transactional producer) while the stream's driver is SIGKILLed >= 15
## times (the supervisor DAG brings it back), the broker restarted twice, InfluxDB stopped 2 min and Airflow's
## scheduler restarted, and beside the stream the recompute DAG every 5 min, two rebuilds of the hour being
## written, a maintenance run, a recompute backfill and an archive backfill; then the batch layer, and every
## output (Delta, metrics topic, InfluxDB, raw archive) against the ground truth. Results in
## benchmarks/results/chaos.{json,md}; exits 1 on any difference.
## Shorter: make chaos MINUTES=5; more options: make chaos CHAOS="--seed 42 --keep" (python -m benchmarks.chaos --help)
MINUTES ?= 20
CHAOS ?=
chaos: setup
	@$(PY) -m benchmarks.chaos --minutes $(MINUTES) $(CHAOS)

## chaos-s3: the same with the tables and checkpoints on s3a:// (moto's S3 and DynamoDB on loopback, kdq's
## DynamoDB log store), ~10 min of faults; results in benchmarks/results/chaos_s3a.{json,md}
S3_MINUTES ?= 10
chaos-s3: setup-s3
	@$(PY) -m benchmarks.chaos --storage s3a --minutes $(S3_MINUTES) $(CHAOS)

lint: setup
	@$(VENV)/bin/ruff check include plugins dags spark_jobs tests

## package: dist/kdq.zip, the shared package for spark-submit --py-files on a cluster
package: setup
	@mkdir -p dist && $(PY) -c "import pathlib, zipfile; \
	  z = zipfile.ZipFile('dist/kdq.zip', 'w', zipfile.ZIP_DEFLATED); \
	  [z.write(p, p.relative_to('include')) for p in sorted(pathlib.Path('include/kdq').rglob('*')) if p.suffix in ('.py', '.typed')]; \
	  z.close()" && echo "dist/kdq.zip"
