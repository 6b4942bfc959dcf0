"""A local InfluxDB 1.x (Debian's influxdb package) with its own config file and data folder."""

from __future__ import annotations

import shutil

import requests

from kdq.config import Config
from kdq.procs import ManagedProcess, StackError, port_open, wait_until

CONFIG_TEMPLATE = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"

[meta]
  dir = "{home}/meta"
  logging-enabled = false

[data]
  dir = "{home}/data"
  wal-dir = "{home}/wal"
  query-log-enabled = false
  trace-logging-enabled = false

[monitor]
  store-enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{port}"
  auth-enabled = false
  log-enabled = false
  max-body-size = 0

[logging]
  level = "warn"

[subscriber]
  enabled = false

[continuous_queries]
  enabled = false
"""


class LocalInflux:
    def __init__(self, config: Config, port: int, rpc_port: int) -> None:
        self.config = config
        self.port = port
        self.rpc_port = rpc_port
        self.home = config.data_dir / "influxdb"
        self.config_file = self.home / "influxdb.conf"
        self.process = ManagedProcess(
            name="influxdb",
            pid_file=self.home / "influxd.pid",
            log_file=self.home / "influxd.log",
            marker=str(self.config_file),
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self, timeout: float = 2.0) -> bool:
        if not port_open(self.port):
            return False
        return requests.get(f"{self.url}/ping", timeout=timeout).status_code == 204

    def start(self, timeout: float = 60.0) -> None:
        if not self.process.running():
            influxd = shutil.which("influxd")
            if influxd is None:
                raise StackError(
                    "influxd not found: install Debian's influxdb package (`make setup` does: apt-get install influxdb)"
                )
            for port in (self.port, self.rpc_port):
                if port_open(port):
                    raise StackError(f"influxdb: port {port} is already in use by another program")
            self.home.mkdir(parents=True, exist_ok=True)
            self.config_file.write_text(
                CONFIG_TEMPLATE.format(home=self.home, port=self.port, rpc_port=self.rpc_port)
            )
            self.process.start([influxd, "run", "-config", str(self.config_file)])
        wait_until(self.healthy, timeout, "influxdb", alive=self.process.running, log=self.process.log_tail)
        self.create_database(self.config.influxdb.database)

    def create_database(self, name: str) -> None:
        response = requests.post(f"{self.url}/query", params={"q": f'CREATE DATABASE "{name}"'}, timeout=10)
        if response.status_code != 200 or "error" in response.text:
            raise StackError(f"influxdb: CREATE DATABASE {name} failed: {response.status_code} {response.text}")

    def stop(self) -> bool:
        return self.process.stop(timeout=20)
