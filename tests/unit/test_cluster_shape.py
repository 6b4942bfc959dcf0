"""The cluster shape's pure parts (docs/cluster.md): which master a job gets, what a submit ships, the ports
recorded. No process is started."""

from __future__ import annotations

import json
import sys
import zipfile

from kdq.spark.session import spark_conf
from kdq.spark.submit import submit_command
from kdq.stack.manager import _ports
from tests.conftest import make_config


def _record(config, **state) -> None:
    config.state_file.parent.mkdir(parents=True, exist_ok=True)
    config.state_file.write_text(json.dumps(state))


def test_a_local_master_follows_the_recorded_cluster(tmp_path) -> None:
    config = make_config(tmp_path, spark={"master": "local[2]"})
    assert config.spark_master() == "local[2]"
    _record(config, cluster=True, spark_master="spark://127.0.0.1:7111", kafka_port=9, kafka_bootstrap="a:1,b:2")
    assert config.spark_master() == "local[2]", "a config reads the recorded addresses once, when loaded"
    config = config.reload_stack_addresses()
    assert config.spark_master() == "spark://127.0.0.1:7111"
    assert config.kafka_bootstrap() == "a:1,b:2"
    _record(config, cluster=False, spark_master="spark://127.0.0.1:7111", kafka_port=9)
    config = make_config(tmp_path, spark={"master": "local[2]"})  # loaded again
    assert config.spark_master() == "local[2]" and config.kafka_bootstrap() == "127.0.0.1:9"


def test_a_configured_cluster_master_is_kept(tmp_path) -> None:
    config = make_config(tmp_path, spark={"master": "spark://spark-master:7077"})
    _record(config, cluster=True, spark_master="spark://127.0.0.1:7111")
    assert config.reload_stack_addresses().spark_master() == "spark://spark-master:7077"


def test_loopback_master_ships_jars_python_and_package(tmp_path) -> None:
    config = make_config(tmp_path, spark={"master": "spark://127.0.0.1:7111"})
    conf = spark_conf(config, "x")
    assert "delta-spark" in conf["spark.jars"] and conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.executor.cores"] == "1"
    command = submit_command(config, "stream_counts", [])
    package = command[command.index("--py-files") + 1]
    names = zipfile.ZipFile(package).namelist()
    assert "kdq/config/__init__.py" in names and "kdq/spark/session.py" in names
    assert "--jars" in command


def test_remote_master_gets_no_local_paths(tmp_path) -> None:
    """The compose deployment's master: its executors have their own jars (--packages) and Python."""
    config = make_config(tmp_path, spark={"master": "spark://spark-master:7077"})
    conf = spark_conf(config, "x")
    assert "spark.jars" not in conf and "spark.pyspark.python" not in conf and "spark.executor.memory" not in conf


def test_local_master_unchanged(tmp_path) -> None:
    config = make_config(tmp_path, spark={"master": "local[2]"})
    command = submit_command(config, "stream_counts", [])
    assert "--py-files" not in command and "--jars" in command
    assert "spark.executor.cores" not in spark_conf(config, "x")


def test_cluster_ports_are_recorded_beside_the_single_stack_ones(tmp_path) -> None:
    config = make_config(tmp_path)
    single = _ports(config)
    cluster = _ports(config, cluster=True)
    assert {k: cluster[k] for k in single} == single, "the single stack's ports are reused"
    extra = set(cluster) - set(single)
    assert {"kafka2_port", "kafka3_controller_port", "spark_master_port", "spark_worker2_ui_port"} <= extra
    assert len(set(cluster.values())) == len(cluster), "every port distinct"
    assert config.local_state()["spark_master_port"] == cluster["spark_master_port"]


def test_the_products_cluster_has_bigger_workers_and_capped_long_running_apps(tmp_path) -> None:
    """`kdq run --cluster` (LocalStack product=True): workers offer PRODUCT_WORKER_CORES, the SQL endpoint's
    application is capped (a configured cap is kept); the bare shape (`kdq up --cluster`, the tests, the
    cluster benchmark) keeps 1-core workers and no endpoint. Nothing is started."""
    from kdq.spark.submit import cores_max
    from kdq.stack.manager import LocalStack
    from kdq.stack.spark_cluster import PRODUCT_WORKER_CORES, WORKER_CORES, product_caps, product_caps_env

    config = make_config(tmp_path)
    product = LocalStack(config, with_sql_endpoint=True, cluster=True, product=True)
    assert product.spark.worker_cores == PRODUCT_WORKER_CORES > WORKER_CORES == 1
    assert product.with_sql_endpoint and cores_max(product.sql_endpoint.config, "sql_endpoint") == 1
    bare = LocalStack(config, with_sql_endpoint=True, cluster=True)
    assert bare.spark.worker_cores == WORKER_CORES and not bare.with_sql_endpoint
    assert cores_max(bare.sql_endpoint.config, "sql_endpoint") == 0
    assert LocalStack(config, with_sql_endpoint=True, cluster=False, product=True).with_sql_endpoint
    assert product_caps(config) == {"stream_cores_max": 1, "sql_endpoint_cores_max": 1}
    configured = make_config(tmp_path, spark={"stream_cores_max": 2})
    assert product_caps_env(configured) == {
        "KDQ_SPARK__STREAM_CORES_MAX": "2",
        "KDQ_SPARK__SQL_ENDPOINT_CORES_MAX": "1",
    }


def test_idle_kafka_fetched_data_is_kept_a_second_unless_configured(tmp_path) -> None:
    # Spark's default keeps every partition's last poll 5 minutes: ~0.5 GB of a 2 GB heap after a million-record
    # catch-up over 1,000 topics (benchmarks/PERF_NOTES.md, "twenty-fourth pass").
    conf = spark_conf(make_config(tmp_path), "x")
    assert conf["spark.kafka.consumer.fetchedData.cache.timeout"] == "1s"
    assert conf["spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval"] == "1s"
    conf = spark_conf(make_config(tmp_path, spark={"conf": {"spark.kafka.consumer.fetchedData.cache.timeout": "5m"}}), "x")
    assert conf["spark.kafka.consumer.fetchedData.cache.timeout"] == "5m"
