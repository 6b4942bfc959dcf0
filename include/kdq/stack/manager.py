"""The local stack: `up`, `down`, `status` for the embedded default deployment.

Ports are chosen once (free loopback ports, unless configured) and recorded
in ``<data_dir>/stack/state.json``; every later process (the stream, batch
jobs, the CLI, Airflow tasks) resolves the broker and InfluxDB from there when
it loads its config. The stack reads them again itself once it has recorded
them (``LocalStack.config``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from kdq.config import Config
from kdq.procs import StackError, port_open, quiet_port
from kdq.stack.airflow import PORT_ENV as AIRFLOW_PORT_ENV
from kdq.stack.airflow import USERNAME as AIRFLOW_USER
from kdq.stack.airflow import LocalAirflow
from kdq.stack.influx import LocalInflux
from kdq.stack.kafka import LocalKafka
from kdq.stack.registry import LocalRegistry
from kdq.stack.spark_cluster import PRODUCT_WORKER_CORES, WORKER_CORES, LocalSparkCluster, with_product_caps
from kdq.stack.sql_endpoint import LocalSqlEndpoint
from kdq.storage import tables_location


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    address: str
    running: bool
    healthy: bool
    detail: str = ""

    def line(self) -> str:
        state = "healthy" if self.healthy else ("running, NOT healthy" if self.running else "stopped")
        return f"{self.name:<14} {self.address:<28} {state}{('  ' + self.detail) if self.detail else ''}"


# The cluster shape (kdq up --cluster): Kafka nodes 2.. and Spark standalone workers beside node 1 / the master.
CLUSTER_KAFKA_NODES = 3
CLUSTER_SPARK_WORKERS = 2


def _cluster_port_keys() -> list[str]:
    keys = []
    for node in range(2, CLUSTER_KAFKA_NODES + 1):
        keys += [f"kafka{node}_port", f"kafka{node}_controller_port"]
    keys += ["spark_master_port", "spark_master_ui_port"]
    keys += [f"spark_worker{i}_ui_port" for i in range(1, CLUSTER_SPARK_WORKERS + 1)]
    return keys


def _ports(config: Config, cluster: bool = False) -> dict[str, int]:
    """Configured ports win; otherwise reuse the recorded ones; otherwise pick free ones and record them."""
    state = config.local_state()
    wanted = {
        "kafka_port": config.kafka.local_port,
        "kafka_controller_port": config.kafka.local_controller_port,
        "influx_port": config.influxdb.local_port,
        "influx_rpc_port": config.influxdb.local_rpc_port,
        "airflow_port": int(os.environ.get(AIRFLOW_PORT_ENV) or 0),
        "sql_connect_port": 0,
        "sql_thrift_port": 0,
        "registry_port": config.registry.local_port,
        **({key: 0 for key in _cluster_port_keys()} if cluster else {}),
    }
    ports: dict[str, int] = {}
    for key, value in wanted.items():
        # New ports come from below the ephemeral range (quiet_port): they are recorded and reused on every
        # start, so no outgoing connection may take one while its component is down.
        ports[key] = value or int(state.get(key) or 0) or quiet_port(taken=set(ports.values()))
    if ports != {k: state.get(k) for k in ports}:
        config.state_file.parent.mkdir(parents=True, exist_ok=True)
        config.state_file.write_text(json.dumps({**state, **ports}, indent=2))
    return ports


class LocalStack:
    def __init__(
        self,
        config: Config,
        with_sql_endpoint: bool = False,
        cluster: bool | None = None,
        product: bool = False,
        with_registry: bool = False,
    ) -> None:
        """``with_sql_endpoint``: `up` also starts the always-on SQL endpoint (`kdq up`, `kdq run`); jobs and
        tests that only need the broker and InfluxDB leave it out (it is a Spark driver of its own).

        ``with_registry``: `up` also starts the Schema Registry (:class:`~kdq.stack.registry.LocalRegistry`;
        `kdq up`, `kdq run`), unless ``registry.url`` names another one: kdq then uses that and starts none.

        ``cluster``: the stack's shape, three Kafka brokers and a Spark standalone cluster (True) or one
        broker with Spark in local mode (False); None is the shape recorded by the last `up` (`status`,
        `down` and the jobs follow what runs).

        ``product``: the stack of `kdq run`, where the stream and the SQL endpoint run for good beside the
        batch jobs. On the cluster shape its workers offer more cores
        (:data:`~kdq.stack.spark_cluster.PRODUCT_WORKER_CORES`) and the endpoint is an application of the
        master with a core cap (:func:`~kdq.stack.spark_cluster.product_caps`; Airflow's environment caps
        the stream the same way). Without it the cluster shape is the bare one of `kdq up --cluster`, the
        tests and the cluster benchmark: 1-core workers and no SQL endpoint (an always-on application would
        hold one of the two cores)."""
        recorded = bool(config.local_state().get("cluster"))
        self.cluster = recorded if cluster is None else cluster
        self.product = product
        self.with_sql_endpoint = with_sql_endpoint and (product or not self.cluster)
        ports = _ports(config, self.cluster)
        # The ports are recorded now: the stack's config and its components' resolve its addresses from them.
        self.config = config = config.reload_stack_addresses()
        extra_nodes = [
            (ports[f"kafka{n}_port"], ports[f"kafka{n}_controller_port"]) for n in range(2, CLUSTER_KAFKA_NODES + 1)
        ] if self.cluster else []
        self.kafka = LocalKafka(config, ports["kafka_port"], ports["kafka_controller_port"], extra_nodes)
        self.spark: LocalSparkCluster | None = None
        if self.cluster:
            self.spark = LocalSparkCluster(
                config, ports["spark_master_port"], ports["spark_master_ui_port"],
                [ports[f"spark_worker{i}_ui_port"] for i in range(1, CLUSTER_SPARK_WORKERS + 1)],
                worker_cores=PRODUCT_WORKER_CORES if product else WORKER_CORES,
            )
            if not product and self.spark.master.running():
                # A worker restarted by a later `kdq up --cluster` joins the running cluster in its shape.
                self.spark.worker_cores = int(config.local_state().get("spark_worker_cores") or WORKER_CORES)
        self.influx = LocalInflux(config, ports["influx_port"], ports["influx_rpc_port"])
        # Started by `make run` (kdq run), not by `up`: the stack alone is what tests and jobs need.
        self.airflow = LocalAirflow(config, ports["airflow_port"])
        # On the cluster the endpoint is an application of the master: capped, or it would take every core.
        endpoint_config = with_product_caps(config) if self.cluster and product else config
        self.sql_endpoint = LocalSqlEndpoint(endpoint_config, ports["sql_connect_port"], ports["sql_thrift_port"])
        self.registry = LocalRegistry(config, ports["registry_port"])
        self.with_registry = with_registry and not config.registry.url

    def up(self) -> list[ComponentStatus]:
        """Start what is not running and wait until healthy. Starting twice is harmless."""
        self.check_shape()
        self._record_shape()
        if self.spark is not None:
            # Before the SQL endpoint: a local[...] master of this folder now resolves to it.
            self.spark.start()
        if self.with_sql_endpoint:
            # Its JVM and session start while the broker does; waited for below.
            self.sql_endpoint.start(wait=False)
        if self.with_registry:
            self.registry.start(wait=False)  # the same: waited for below
            # From now until `down`, Config.registry_url() resolves to it; a stack started without the registry
            # (`kdq up --no-registry`, the tests' stack) records its port but never makes it the default URL.
            self._record_state(registry_started=True)
        self.kafka.start()
        self.kafka.create_topic(self.config.kafka.metrics_topic, partitions=3, config={"cleanup.policy": "compact"})
        if self.config.influxdb.enabled:
            self.influx.start()
        if self.with_registry:
            self.registry.wait()
        if self.with_sql_endpoint:
            # On the cluster its session also waits for an executor of the master.
            self.sql_endpoint.wait(timeout=480 if self.cluster else 240)
        return self.status()

    def check_shape(self) -> None:
        """Raise StackError, before anything starts, when this shape cannot start here: the stack of the other
        shape runs, the Kafka data was formatted for another quorum, or `kdq run --cluster` meets workers
        started by `kdq up --cluster` (1 core each: the stream and the SQL endpoint would hold both, and
        every batch job would wait)."""
        state = self.config.local_state()
        command = f"kdq {'run' if self.product else 'up'}{' --cluster' if self.cluster else ''}"
        if bool(state.get("cluster")) != self.cluster:
            other = LocalStack(self.config, cluster=not self.cluster)
            running = [n.process.name for n in other.kafka.nodes if n.process.running()]
            if other.spark is not None and other.spark.running():
                running.append("spark cluster")
            if running:
                raise StackError(
                    f"the stack of {self.config.data_dir} runs as a {'cluster' if not self.cluster else 'single broker'}"
                    f" ({', '.join(running)}): stop it with `kdq down` before `{command}`"
                )
        nodes = len(self.kafka.nodes)
        formatted = int(state.get("kafka_nodes") or 0)
        if formatted and formatted != nodes and (self.kafka.home / "data" / "meta.properties").exists():
            raise StackError(
                f"the Kafka data in {self.config.data_dir} belongs to a {formatted}-node quorum, not {nodes}: "
                f"use another data folder, or delete {self.config.data_dir}/kafka* (its topics are lost)"
            )
        spark = self.spark
        if spark is None or not self.product or not spark.master.running():
            return
        try:
            offered = spark.offered_cores()
        except Exception:  # the master not answering: start() waits for it and says so
            return
        if offered and offered != {spark.worker_cores}:
            raise StackError(
                f"the Spark workers of {self.config.data_dir} offer {', '.join(map(str, sorted(offered)))} core(s) "
                f"each (started by `kdq up --cluster`); `{command}` needs {spark.worker_cores} per worker for the "
                "stream, the SQL endpoint and the batch jobs beside each other: stop it with `kdq down` first"
            )

    def _record_shape(self) -> None:
        """Record the shape in the state file (what `status`, `down`, Config.kafka_bootstrap and
        Config.spark_master follow), once :meth:`check_shape` allowed it."""
        state = self.config.local_state()
        shape = {"cluster": self.cluster, "kafka_nodes": len(self.kafka.nodes)}
        if self.spark is not None:
            shape |= {
                "kafka_bootstrap": self.kafka.bootstrap,
                "spark_master": self.spark.url,
                "spark_worker_cores": self.spark.worker_cores,
            }
        cluster_keys = ("kafka_bootstrap", "spark_master", "spark_worker_cores")
        new_state = {k: v for k, v in state.items() if k not in cluster_keys} | shape
        if new_state != state:
            self._write_state(new_state)

    def _record_state(self, **values: Any) -> None:
        state = self.config.local_state()
        if any(state.get(k) != v for k, v in values.items()):
            self._write_state(state | values)

    def _write_state(self, state: dict[str, Any]) -> None:
        """Record ``state`` in the state file; the stack's config and its components' then read the addresses
        again (a Config reads them once, when built: kdq.config.local_stack)."""
        self.config.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.config.state_file.write_text(json.dumps(state, indent=2))
        self.config = self.config.reload_stack_addresses()
        for component in (self.kafka, self.spark, self.influx, self.airflow, self.sql_endpoint, self.registry):
            if component is not None:
                component.config = component.config.reload_stack_addresses()

    def down(self) -> list[str]:
        """Stop every component; returns the names of those that were running."""
        from kdq.spark.stream_process import stop_stream
        from kdq.traffic.process import stop_demo

        # The producer first, then Airflow (its supervisor would restart the stream), then the stream.
        stopped = ["demo"] if stop_demo(self.config) else []
        if self.airflow.stop():
            stopped.append("airflow")
        if stop_stream(self.config):
            stopped.append("stream")
        for name, component in (
            ("sql-endpoint", self.sql_endpoint), ("registry", self.registry), ("influxdb", self.influx),
        ):
            if component.stop():
                stopped.append(name)
        self._record_state(registry_started=False)
        if self.spark is not None and self.spark.stop():
            stopped.append("spark-cluster")
        if self.kafka.stop():
            stopped.append("kafka")
        return stopped

    def status(self) -> list[ComponentStatus]:
        result = self._cluster_status() if self.cluster else []
        for name, component, address in (
            *([] if self.cluster else [("kafka", self.kafka, self.kafka.bootstrap)]),
            ("influxdb", self.influx, self.influx.url),
        ):
            running = component.process.running()
            try:
                healthy = running and component.healthy()
            except Exception as exc:  # report, never raise, from a status probe
                result.append(ComponentStatus(name, address, running, False, f"probe failed: {exc}"))
                continue
            result.append(ComponentStatus(name, address, running, healthy))
        # Airflow and the demo producer are listed while they run (`make run`); a stack started with
        # `kdq up` alone is healthy without them.
        if self.airflow.process.running():
            try:
                healthy = self.airflow.healthy()
            except Exception:
                healthy = False
            result.append(ComponentStatus("airflow", self.airflow.url, True, healthy, f"login {AIRFLOW_USER} / {self.airflow.password()}"))
        # Listed from its start until `down` (the pid file stays when it dies): a crashed endpoint shows
        # as stopped, and `kdq status` fails, instead of disappearing from the list.
        endpoint = self.sql_endpoint
        if endpoint.process.pid_file.exists():
            running = endpoint.process.running()
            detail = f"Spark Connect; JDBC {endpoint.jdbc_url}" if running else f"log: {endpoint.process.log_file}"
            result.append(ComponentStatus("sql", endpoint.connect_url, running, running and endpoint.healthy(), detail))
        registry = self.registry
        if registry.process.pid_file.exists():  # the same: from its start until `down`
            running = registry.process.running()
            try:
                healthy = running and registry.healthy()
            except Exception:  # report, never raise, from a status probe
                healthy = False
            detail = "Schema Registry (Apicurio, Confluent-compatible API)" if running else f"log: {registry.process.log_file}"
            result.append(ComponentStatus("registry", registry.url, running, healthy, detail))
        from kdq.traffic.process import demo_process, read_stats

        if demo_process(self.config).running():
            stats = read_stats(self.config) or {}
            detail = f"{stats.get('produced', 0)} records produced, {stats.get('failed', 0)} failed"
            result.append(ComponentStatus("demo", ",".join(stats.get("topics", {})) or "-", True, True, detail))
        if self.cluster:
            return result
        from kdq.spark.session import REQUIRED_JAR_PREFIXES

        jars = sorted((self.config.jars_dir / "spark").glob("*.jar"))
        ready = all(any(j.name.startswith(p) for j in jars) for p in REQUIRED_JAR_PREFIXES)
        result.append(
            ComponentStatus(
                "spark",
                self.config.spark_master(),
                ready,
                ready,
                f"Delta tables in {tables_location(self.config)}" if ready else "connector jars missing: run `make setup`",
            )
        )
        return result

    def _cluster_status(self) -> list[ComponentStatus]:
        """One line per Kafka node and Spark daemon, then the cluster as a whole (what jobs need)."""
        result = []
        try:
            brokers = self.kafka.healthy()
        except Exception:
            brokers = False
        for node in self.kafka.nodes:
            running = node.process.running()
            result.append(ComponentStatus(f"kafka-{node.node_id}", node.address, running, running and port_open(node.port)))
        result.append(ComponentStatus(
            "kafka", f"{len(self.kafka.nodes)} brokers", self.kafka.running(), brokers,
            f"RF {self.kafka.replication_factor}, min.insync.replicas {self.kafka.min_insync_replicas}",
        ))
        spark = self.spark
        assert spark is not None
        try:
            alive = spark.alive_workers()
            state = spark.status().get("status", "?")
        except Exception:
            alive, state = 0, "not answering"
        result.append(ComponentStatus(
            "spark-master", spark.url, spark.master.running(), spark.master.running() and state == "ALIVE",
            f"UI {spark.ui_url}; {alive} of {len(spark.workers)} workers alive",
        ))
        for worker, ui_port in zip(spark.workers, spark.worker_ui_ports, strict=True):
            running = worker.running()
            result.append(ComponentStatus(
                worker.name, f"http://127.0.0.1:{ui_port}", running, running and port_open(ui_port),
                f"log: {worker.log_file}" if not running else "",
            ))
        return result
