"""A Spark standalone cluster on loopback (``kdq up --cluster``): one master and two workers, started from the
pyspark distribution's own classes with ``spark-class``, as a real standalone deployment runs them.

Jobs submitted to ``spark://127.0.0.1:<port>`` run their driver in the submitting process (client mode) and
their tasks in executor JVMs the workers launch: the kdq package travels with ``--py-files`` and the
connector jars with ``--jars`` (kdq.spark.submit), and the executors' Python is the venv's
(``spark.pyspark.python``). Tables and checkpoints stay local paths: every JVM runs on this machine.

Sized for a 2-core machine: each worker offers 1 core and 2 GB, so one application gets two 1-core
executors. The whole product on this shape (``kdq run --cluster``) keeps two applications for good (the
stream and the SQL endpoint) beside the batch jobs: its workers offer :data:`PRODUCT_WORKER_CORES` cores each
and those two applications are capped (:func:`product_caps`); see docs/cluster.md. The web UIs bind recorded
quiet ports (the master's is its health probe: ``/json``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kdq.config import Config
from kdq.procs import ManagedProcess, StackError, port_open, wait_until

WORKER_CORES = 1
WORKER_MEMORY = "2g"
# `kdq run --cluster`: the stream (1 core) and the SQL endpoint (1 core) never give their executors back, and
# the hourly recompute, rebuilds and maintenance need cores beside them. A standalone worker's --cores is what
# it offers the master, not what the machine has: 2 x 2 leaves two 1-core executors for the batch jobs. Each
# worker's 2 GB still holds two 1 GB executors, so memory is not oversubscribed, only the 2 CPUs, which every
# process of this stack shares anyway.
PRODUCT_WORKER_CORES = 2
# spark.cores.max of each long-running application of the product on this cluster (when not configured).
PRODUCT_LONG_RUNNING_CORES = 1
# Heap of the master and worker daemons themselves (executors get spark.executor.memory).
DAEMON_MEMORY = "384m"


def spark_home() -> Path:
    """The pyspark package: it is a Spark distribution (bin/spark-class, jars/)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise StackError(f"spark-class not found in {home / 'bin'}: reinstall pyspark (make setup)")
    return home


CAPPED_KEYS = ("stream_cores_max", "sql_endpoint_cores_max")


def product_caps(config: Config) -> dict[str, int]:
    """``spark.stream_cores_max`` and ``spark.sql_endpoint_cores_max`` of the product on the loopback cluster:
    as configured, else :data:`PRODUCT_LONG_RUNNING_CORES`. 0 (no cap) is not kept: an uncapped stream or
    endpoint takes every free core and holds it, and the batch jobs would wait forever."""
    return {key: getattr(config.spark, key) or PRODUCT_LONG_RUNNING_CORES for key in CAPPED_KEYS}


def with_product_caps(config: Config) -> Config:
    """``config`` with :func:`product_caps` (for the processes this one submits itself: the SQL endpoint)."""
    return config.model_copy(update={"spark": config.spark.model_copy(update=product_caps(config))})


def product_caps_env(config: Config) -> dict[str, str]:
    """:func:`product_caps` as ``KDQ_SPARK__*`` variables, for the environment of Airflow, whose tasks load
    the config themselves and submit the stream (the supervisor) and the batch jobs."""
    return {f"KDQ_SPARK__{key.upper()}": str(value) for key, value in product_caps(config).items()}


class LocalSparkCluster:
    def __init__(
        self,
        config: Config,
        master_port: int,
        master_ui_port: int,
        worker_ui_ports: list[int],
        worker_cores: int = WORKER_CORES,
    ) -> None:
        """``worker_cores``: what each worker started here offers the master (:data:`WORKER_CORES`;
        :data:`PRODUCT_WORKER_CORES` for ``kdq run --cluster``)."""
        self.config = config
        self.worker_cores = worker_cores
        self.master_port = master_port
        self.master_ui_port = master_ui_port
        self.worker_ui_ports = list(worker_ui_ports)
        self.home = config.data_dir / "spark-cluster"
        self.master = self._process("spark-master")
        self.workers = [self._process(f"spark-worker-{i}") for i in range(1, len(self.worker_ui_ports) + 1)]

    def _process(self, name: str) -> ManagedProcess:
        return ManagedProcess(
            name=name,
            pid_file=self.home / f"{name}.pid",
            log_file=self.home / f"{name}.log",
            # Its properties file: unique per data folder and in the JVM's command line.
            marker=str(self.home / f"{name}.conf"),
        )

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}"

    def processes(self) -> list[ManagedProcess]:
        return [self.master, *self.workers]

    def _env(self) -> dict[str, str]:
        return {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            # Workers pass these to the executors they launch: the venv's Python for the Python workers.
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TZ": "UTC",
        }

    def _command(self, process: ManagedProcess, main: str, *args: str) -> list[str]:
        conf = Path(process.marker)
        conf.parent.mkdir(parents=True, exist_ok=True)
        # Executors' folders (and the application's files fetched from the driver) go away with the app.
        conf.write_text(
            "spark.worker.cleanup.enabled true\n"
            "spark.worker.cleanup.appDataTtl 3600\n"
            "spark.master.rest.enabled false\n"
        )
        return [str(spark_home() / "bin" / "spark-class"), main, "--properties-file", str(conf), *args]

    def status(self) -> dict:
        """The master's view (``/json``): status and workers; raises when it does not answer."""
        import requests

        response = requests.get(f"{self.ui_url}/json/", timeout=3)
        response.raise_for_status()
        return response.json()

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def offered_cores(self) -> set[int]:
        """The cores each alive worker offers, as the master sees them."""
        return {int(w.get("cores") or 0) for w in self.status().get("workers", []) if w.get("state") == "ALIVE"}

    def healthy(self) -> bool:
        if not port_open(self.master_port):
            return False
        state = self.status()
        return state.get("status") == "ALIVE" and self.alive_workers() >= len(self.workers)

    def running(self) -> bool:
        return any(p.running() for p in self.processes())

    def _logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail(15)}" for p in self.processes())

    def start(self, timeout: float = 120.0) -> None:
        if not self.master.running():
            for port in (self.master_port, self.master_ui_port):
                if port_open(port):
                    raise StackError(f"spark-master: port {port} is already in use by another program")
            self.master.start(
                self._command(
                    self.master, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.master_port), "--webui-port", str(self.master_ui_port),
                ),
                env=self._env(), cwd=self.home,
            )
            wait_until(lambda: self.status().get("status") == "ALIVE", timeout, "spark-master",
                       alive=self.master.running, log=self.master.log_tail)
        for worker, ui_port in zip(self.workers, self.worker_ui_ports, strict=True):
            if worker.running():
                continue
            if port_open(ui_port):
                raise StackError(f"{worker.name}: port {ui_port} is already in use by another program")
            work_dir = self.home / worker.name
            work_dir.mkdir(parents=True, exist_ok=True)
            worker.start(
                self._command(
                    worker, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                    "--cores", str(self.worker_cores), "--memory", WORKER_MEMORY, "--webui-port", str(ui_port),
                    "--work-dir", str(work_dir), self.url,
                ),
                env=self._env(), cwd=work_dir,
            )
        wait_until(self.healthy, timeout, "spark cluster", alive=lambda: all(p.running() for p in self.processes()),
                   log=self._logs)

    def stop(self) -> bool:
        """Workers first (their executors with them), then the master."""
        stopped = [p.stop(timeout=30) for p in [*self.workers, self.master]]
        return any(stopped)
