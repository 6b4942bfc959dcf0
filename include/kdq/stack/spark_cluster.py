"""A Spark standalone cluster on loopback (``kdq up --cluster``): one master and two workers, started from the
pyspark distribution's own classes with ``spark-class``, as a real standalone deployment runs them.

Jobs submitted to ``spark://127.0.0.1:<port>`` run their driver in the submitting process (client mode) and
their tasks in executor JVMs the workers launch: the kdq package travels with ``--py-files`` and the
connector jars with ``--jars`` (kdq.spark.submit), and the executors' Python is the venv's
(``spark.pyspark.python``). Tables and checkpoints stay local paths: every JVM runs on this machine.

Sized for a 2-core machine: each worker offers 1 core and 2 GB, so one application gets two 1-core
executors. The web UIs bind recorded quiet ports (the master's is its health probe: ``/json``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kdq.config import Config
from kdq.stack.procs import ManagedProcess, StackError, port_open, wait_until

WORKER_CORES = 1
WORKER_MEMORY = "2g"
# Heap of the master and worker daemons themselves (executors get spark.executor.memory).
DAEMON_MEMORY = "384m"


def spark_home() -> Path:
    """The pyspark package: it is a Spark distribution (bin/spark-class, jars/)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise StackError(f"spark-class not found in {home / 'bin'}: reinstall pyspark (make setup)")
    return home


class LocalSparkCluster:
    def __init__(self, config: Config, master_port: int, master_ui_port: int, worker_ui_ports: list[int]) -> None:
        self.config = config
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
                    "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, "--webui-port", str(ui_port),
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
