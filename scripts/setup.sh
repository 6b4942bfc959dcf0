#!/usr/bin/env bash
# One-time, idempotent set-up of everything kdq needs on this machine:
#   - Debian packages: influxdb (local InfluxDB 1.x), docker-compose (validates the
#     cluster deployment file), a Java 17 runtime and Maven, chromium and chromium-driver
#     (the Airflow UI test) if missing;
#   - .venv from requirements.txt, plus the kdq package itself (editable);
#   - the JVM jars from Maven Central (Kafka broker; Spark's Kafka connector and Delta)
#     into .cache/jars/; the Schema Registry (Apicurio Registry's application) unpacked into
#     .cache/jars/schema-registry/; kdq's own jvm/kdq-spark-functions built (with its tests) into
#     .cache/jars/kdq/kdq-spark-functions.jar; the benchmark's Kafka Streams baseline (jvm/kstreams-baseline)
#     built with its dependencies into .cache/jars/kstreams-baseline/.
# Each step is skipped when its inputs have not changed (stamp files in .cache/; every Maven step's inputs
# include jvm/pom.xml, the modules' parent), so a re-run takes a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$ROOT/.cache
mkdir -p "$CACHE/stamps"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] %s\033[0m\n' "$*" >&2; exit 1; }
stamp_ok() { [ -f "$CACHE/stamps/$1" ] && [ "$(cat "$CACHE/stamps/$1")" = "$2" ]; }
stamp_set() { echo "$2" > "$CACHE/stamps/$1"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
# The inputs of a Maven module: the parent pom (jvm/pom.xml: shared versions and plugins) and the module's pom and
# sources; the first argument is the module's folder.
module_hash() { (cat jvm/pom.xml; cd "$1" && find pom.xml src -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }

# --- Debian packages -------------------------------------------------------------
need_pkgs=()
command -v influxd >/dev/null || need_pkgs+=(influxdb)
command -v docker-compose >/dev/null || need_pkgs+=(docker-compose)
command -v java >/dev/null || need_pkgs+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need_pkgs+=(maven)
# Headless browser for the Airflow UI test (screenshot of the DAG list through Selenium).
command -v chromium >/dev/null || need_pkgs+=(chromium)
command -v chromedriver >/dev/null || need_pkgs+=(chromium-driver)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian packages: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
    # The influxdb package may start a system-wide daemon; kdq runs its own instance
    # with its own config and ports, so the system one is not needed.
    if command -v service >/dev/null; then service influxdb stop >/dev/null 2>&1 || true; fi
  else
    die "missing: ${need_pkgs[*]}. Install them with: sudo apt-get install ${need_pkgs[*]} (Debian/Ubuntu package names)"
  fi
fi
java -version 2>&1 | grep -qE 'version "(17|2[0-9])' || die "Java 17 or newer is required (found: $(java -version 2>&1 | head -1))"

# --- Python virtualenv -------------------------------------------------------------
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)' \
  || die "Python 3.11+ is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11"
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PY"
  "$PY" -m venv .venv
fi
venv_hash=$(hash_of requirements.txt pyproject.toml)
if ! stamp_ok venv "$venv_hash"; then
  say "installing Python packages from requirements.txt (first run: about 2 minutes)"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -r requirements.txt
  .venv/bin/pip install -q --no-deps -e .
  stamp_set venv "$venv_hash"
fi

# --- JVM jars from Maven Central ---------------------------------------------------
fetch_jars() {  # name pom-dir extra-mvn-args...
  local name=$1 pom=$2; shift 2
  local h; h=$(hash_of jvm/pom.xml "$pom/pom.xml")
  if ! stamp_ok "jars-$name" "$h"; then
    say "fetching $name jars with Maven"
    rm -rf "$CACHE/jars/$name"
    mvn -q -B -f "$pom/pom.xml" dependency:copy-dependencies -DoutputDirectory="$CACHE/jars/$name" "$@" \
      || die "Maven could not fetch the $name jars (see the output above)"
    stamp_set "jars-$name" "$h"
  fi
}
fetch_jars kafka jvm/kafka-broker -DincludeScope=runtime
# Only the listed artifacts: their dependencies ship inside pyspark (see the pom).
fetch_jars spark jvm/spark-connectors -DexcludeTransitive=true

# S3A (tables and checkpoints on s3a://, docs/cluster.md), only on demand: KDQ_SETUP_S3=1 (`make setup-s3`,
# `make test-cluster`). hadoop-aws at pyspark's Hadoop version and the AWS SDK v2 modules it uses (17 MB),
# not the SDK bundle (every service, ~600 MB), and its DynamoDB module; minus what pyspark/jars already holds (see
# the pom). Then kdq's DynamoDB log store (jvm/hadoop-aws/kdq-dynamodb: Delta commits of concurrent writers on
# s3a:// coordinated through DynamoDB), built into the same folder; `package` runs its JUnit tests (about 15 s;
# `make test-cluster` runs them again, tests/integration/test_dynamodb_log_store.py).
if [ "${KDQ_SETUP_S3:-0}" = 1 ]; then
  fetch_jars hadoop-aws jvm/hadoop-aws -DincludeScope=runtime \
    -DexcludeGroupIds=io.netty,org.slf4j,commons-logging,commons-codec,org.apache.httpcomponents,com.fasterxml.jackson.core,joda-time
  ddb_dir=jvm/hadoop-aws/kdq-dynamodb
  ddb_jar=$CACHE/jars/hadoop-aws/kdq-dynamodb.jar
  ddb_hash=$(module_hash "$ddb_dir")
  if ! stamp_ok kdq-dynamodb "$ddb_hash" || [ ! -f "$ddb_jar" ]; then
    say "building $ddb_dir with Maven (its tests included)"
    mvn -q -B -f "$ddb_dir/pom.xml" package || die "Maven could not build $ddb_dir (compile or test failure, see the output above)"
    cp "$ddb_dir/target/kdq-dynamodb.jar" "$ddb_jar.tmp" || die "could not copy the kdq-dynamodb jar"
    mv "$ddb_jar.tmp" "$ddb_jar"
    stamp_set kdq-dynamodb "$ddb_hash"
  fi
fi

# --- The Schema Registry (jvm/schema-registry): Apicurio Registry's whole application ------------------
# The Quarkus application as Apicurio publishes it to Maven Central (io.apicurio:apicurio-registry-app:<version>:
# tar.gz:all, 104 MB; the pom says why it is fetched as a file of the repository), checked against the SHA-256 the
# pom pins, unpacked into .cache/jars/schema-registry/ (the runner jar beside its lib/), where kdq.stack.registry
# runs it with `java -jar` (make run starts it). Unpacked beside and then moved into place, so an interrupted
# fetch leaves no half folder that would look ready.
reg_dir=jvm/schema-registry
reg_out=$CACHE/jars/schema-registry
reg_hash=$(hash_of jvm/pom.xml "$reg_dir/pom.xml")
if ! stamp_ok schema-registry "$reg_hash" || ! compgen -G "$reg_out/apicurio-registry-app-*-runner.jar" >/dev/null; then
  say "fetching the Schema Registry (Apicurio Registry, 104 MB) with Maven"
  rm -rf "$reg_out.tmp" && mkdir -p "$reg_out.tmp"
  archive=$reg_out.tmp/registry.tar.gz
  mvn -q -B -f "$reg_dir/pom.xml" wagon:download-single@fetch -Dregistry.archive="$archive" \
    || die "Maven could not fetch the Schema Registry (io.apicurio:apicurio-registry-app, see the output above)"
  want=$(sed -n 's:.*<apicurio.sha256>\([0-9a-f]*\)</apicurio.sha256>.*:\1:p' "$reg_dir/pom.xml")
  got=$(sha256sum "$archive" | cut -d' ' -f1)
  [ -n "$want" ] && [ "$got" = "$want" ] || die "the Schema Registry archive's SHA-256 is $got, not $want ($reg_dir/pom.xml)"
  tar -xzf "$archive" -C "$reg_out.tmp" && rm -f "$archive" || die "could not unpack the Schema Registry archive"
  compgen -G "$reg_out.tmp/apicurio-registry-app-*-runner.jar" >/dev/null \
    || die "the Schema Registry archive has no apicurio-registry-app-*-runner.jar ($reg_dir/pom.xml)"
  rm -rf "$reg_out"
  mv "$reg_out.tmp" "$reg_out"
  stamp_set schema-registry "$reg_hash"
fi

# --- kdq's own Spark functions (jvm/kdq-spark-functions): one shaded jar ---------------
# The JSON Schema classifier UDF (io.kdq.spark.classify.Classifier) and the SQL endpoint's read-only rule
# (io.kdq.spark.sqlendpoint.ReadOnlyExtension). `package` runs the module's JUnit tests (reasons, event time, the
# JSON-Schema-Test-Suite; the read-only rule on a local SparkSession with Delta, on pyspark's own jars and the
# connector jars fetched above), so `make test` runs them too.
kdq_fn_dir=jvm/kdq-spark-functions
kdq_fn_jar=$CACHE/jars/kdq/kdq-spark-functions.jar
kdq_fn_hash=$(module_hash "$kdq_fn_dir")
if ! stamp_ok kdq-spark-functions "$kdq_fn_hash" || [ ! -f "$kdq_fn_jar" ]; then
  say "building $kdq_fn_dir with Maven (its tests included; about two minutes)"
  pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') \
    || die "pyspark is not installed in .venv"
  mvn -q -B -f "$kdq_fn_dir/pom.xml" package -Dpyspark.jars="$pyspark_jars" -Dconnector.jars="$CACHE/jars/spark" \
    || die "Maven could not build $kdq_fn_dir (compile or test failure, see the output above); kdq-spark-functions.jar is required"
  mkdir -p "$(dirname "$kdq_fn_jar")"
  cp "$kdq_fn_dir/target/kdq-spark-functions.jar" "$kdq_fn_jar.tmp" || die "could not copy the kdq-spark-functions jar"
  mv "$kdq_fn_jar.tmp" "$kdq_fn_jar"
  stamp_set kdq-spark-functions "$kdq_fn_hash"
fi

# --- The benchmark's Kafka Streams baseline (jvm/kstreams-baseline) ----------------------
# A small Kafka Streams application (benchmarks/kstreams.py runs it in `make bench`): its jar and its
# runtime dependencies (kafka-streams at the broker's version, RocksDB, networknt + Jackson 3) in
# .cache/jars/kstreams-baseline/, run as `java -cp '.cache/jars/kstreams-baseline/*'`. No tests: a few seconds.
ksb_dir=jvm/kstreams-baseline
ksb_out=$CACHE/jars/kstreams-baseline
ksb_hash=$(module_hash "$ksb_dir")
if ! stamp_ok kstreams-baseline "$ksb_hash" || [ ! -f "$ksb_out/kstreams-baseline.jar" ]; then
  say "building $ksb_dir with Maven"
  rm -rf "$ksb_out.tmp"
  mvn -q -B -f "$ksb_dir/pom.xml" package dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$ksb_out.tmp" || die "Maven could not build $ksb_dir (see the output above)"
  cp "$ksb_dir/target/kstreams-baseline.jar" "$ksb_out.tmp/" || die "could not copy the kstreams-baseline jar"
  rm -rf "$ksb_out"
  mv "$ksb_out.tmp" "$ksb_out"
  stamp_set kstreams-baseline "$ksb_hash"
fi

say "ready: .venv, $(ls "$CACHE/jars/kafka" | wc -l) Kafka jars, $(ls "$CACHE/jars/spark" | wc -l) Spark connector jars, $(basename "$(ls "$CACHE"/jars/schema-registry/apicurio-registry-app-*-runner.jar)" -runner.jar), $(influxd version 2>/dev/null | head -1)"
