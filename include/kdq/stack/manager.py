"""The local stack: `up`, `down`, `status` for the embedded default deployment.

Ports are chosen once (free loopback ports, unless configured) and recorded
in ``<data_dir>/stack/state.json``; every later process (the stream, batch
jobs, the CLI, Airflow tasks) resolves the broker and InfluxDB from there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from kdq.config import Config
from kdq.stack.airflow import PORT_ENV as AIRFLOW_PORT_ENV
from kdq.stack.airflow import USERNAME as AIRFLOW_USER
from kdq.stack.airflow import LocalAirflow
from kdq.stack.influx import LocalInflux
from kdq.stack.kafka import LocalKafka
from kdq.stack.procs import quiet_port
from kdq.stack.sql_endpoint import LocalSqlEndpoint


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    address: str
    running: bool
    healthy: bool
    detail: str = ""

    def line(self) -> str:
        state = "healthy" if self.healthy else ("running, NOT healthy" if self.running else "stopped")
        return f"{self.name:<10} {self.address:<28} {state}{('  ' + self.detail) if self.detail else ''}"


def _ports(config: Config) -> dict[str, int]:
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
    def __init__(self, config: Config, with_sql_endpoint: bool = False) -> None:
        """``with_sql_endpoint``: `up` also starts the always-on SQL endpoint (`kdq up`, `kdq run`); jobs and
        tests that only need the broker and InfluxDB leave it out (it is a Spark driver of its own)."""
        self.config = config
        self.with_sql_endpoint = with_sql_endpoint
        ports = _ports(config)
        self.kafka = LocalKafka(config, ports["kafka_port"], ports["kafka_controller_port"])
        self.influx = LocalInflux(config, ports["influx_port"], ports["influx_rpc_port"])
        # Started by `make run` (kdq run), not by `up`: the stack alone is what tests and jobs need.
        self.airflow = LocalAirflow(config, ports["airflow_port"])
        self.sql_endpoint = LocalSqlEndpoint(config, ports["sql_connect_port"], ports["sql_thrift_port"])

    def up(self) -> list[ComponentStatus]:
        """Start what is not running and wait until healthy. Starting twice is harmless."""
        if self.with_sql_endpoint:
            # Its JVM and session start while the broker does; waited for below.
            self.sql_endpoint.start(wait=False)
        self.kafka.start()
        self.kafka.create_topic(self.config.kafka.metrics_topic, partitions=3, config={"cleanup.policy": "compact"})
        if self.config.influxdb.enabled:
            self.influx.start()
        if self.with_sql_endpoint:
            self.sql_endpoint.wait()
        return self.status()

    def down(self) -> list[str]:
        """Stop every component; returns the names of those that were running."""
        from kdq.stream_process import stop_stream
        from kdq.traffic import stop_demo

        # The producer first, then Airflow (its supervisor would restart the stream), then the stream.
        stopped = ["demo"] if stop_demo(self.config) else []
        if self.airflow.stop():
            stopped.append("airflow")
        if stop_stream(self.config):
            stopped.append("stream")
        for name, component in (("sql-endpoint", self.sql_endpoint), ("influxdb", self.influx), ("kafka", self.kafka)):
            if component.stop():
                stopped.append(name)
        return stopped

    def status(self) -> list[ComponentStatus]:
        result = []
        for name, component, address in (
            ("kafka", self.kafka, self.kafka.bootstrap),
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
        from kdq.traffic import demo_process, read_stats

        if demo_process(self.config).running():
            stats = read_stats(self.config) or {}
            detail = f"{stats.get('produced', 0)} records produced, {stats.get('failed', 0)} failed"
            result.append(ComponentStatus("demo", ",".join(stats.get("topics", {})) or "-", True, True, detail))
        from kdq.spark.session import REQUIRED_JAR_PREFIXES

        jars = sorted((self.config.jars_dir / "spark").glob("*.jar"))
        ready = all(any(j.name.startswith(p) for j in jars) for p in REQUIRED_JAR_PREFIXES)
        result.append(
            ComponentStatus(
                "spark",
                self.config.spark.master,
                ready,
                ready,
                f"Delta tables in {self.config.tables_dir}" if ready else "connector jars missing: run `make setup`",
            )
        )
        return result
