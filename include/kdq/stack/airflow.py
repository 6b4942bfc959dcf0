"""Airflow standalone as a component of the local stack (``make run``).

One ``airflow standalone`` process (scheduler, DAG processor, API server with the UI, triggerer, all in
its process group) with everything under ``<data_dir>/airflow``: the SQLite metadata database, logs, the
generated admin password and the settings below. Airflow is configured entirely through the environment
of that process (:meth:`LocalAirflow.env`), which its components and task processes inherit, so
``kdq airflow <command>`` runs any Airflow CLI command against the same instance.

Sizing, for a 2-core laptop that also runs Kafka, InfluxDB and Spark: Airflow's defaults start dozens of
processes (about 5.5 GB); here the LocalExecutor has 4 worker slots (``[core] parallelism``: one for a batch
job, in its one-slot pool ``kdq_batch_jobs``, one for the always-on expectations run, one for the stream's
supervisor, which so never waits, and one for the rest: the stop DAG, a manual run), the API server 1 worker and
the DAG processor 1 parsing process.

On the cluster shape (``kdq run --cluster``) the ``spark_default`` connection names the stack's standalone
master, and Airflow's environment caps the stream's cores (:func:`kdq.stack.spark_cluster.product_caps`).

The hourly DAG's start date: see ``plugins/kdq_airflow/defaults.py``. Locally it is the hour Airflow was
first started in this data folder, moved forward to at most ``KDQ_AIRFLOW_CATCHUP_HOURS`` (default 2)
full hours before the current one on a later start, so a fresh ``make run`` queues no catch-up runs and a
restart catches up a bounded number of missed hours. ``airflow backfill create`` ignores the start date.

Environment overrides (not config keys: they only concern this local process): ``KDQ_AIRFLOW_PORT``
(API server/UI port; default a free port, kept in ``stack/state.json``), ``KDQ_AIRFLOW_START_DATE``
(fixed start date of the hourly DAG), ``KDQ_AIRFLOW_CATCHUP_HOURS``, ``KDQ_AIRFLOW_SUPERVISOR_SECONDS`` (how often
the stream supervisor runs; default 120).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

from kdq.airflow_pools import BATCH_POOL, BATCH_POOL_DESCRIPTION, BATCH_POOL_SLOTS
from kdq.config import Config
from kdq.procs import ManagedProcess, StackError, free_port, port_open, wait_until
from kdq.stack.spark_cluster import product_caps_env

PROJECT_ROOT = Path(__file__).resolve().parents[3]
PORT_ENV = "KDQ_AIRFLOW_PORT"
START_DATE_ENV = "KDQ_AIRFLOW_START_DATE"  # read by plugins/kdq_airflow/defaults.py at parse time
SUPERVISOR_INTERVAL_ENV = "KDQ_AIRFLOW_SUPERVISOR_SECONDS"  # likewise: the stream supervisor's schedule
RECOMPUTE_MINUTES_ENV = "KDQ_AIRFLOW_RECOMPUTE_MINUTES"  # likewise: the recompute DAG's interval (the chaos run)
CATCHUP_HOURS_ENV = "KDQ_AIRFLOW_CATCHUP_HOURS"
DEFAULT_CATCHUP_HOURS = 2
USERNAME = "admin"
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
KDQ_DAGS = (
    "kdq_stream_supervisor",
    "kdq_stream_stop",
    "kdq_hourly_recompute",
    "kdq_rebuild",
    "kdq_maintenance",
    "kdq_expectations",
)


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def local_start_date(first_start: datetime, now: datetime, catchup_hours: int = DEFAULT_CATCHUP_HOURS) -> datetime:
    """The hourly DAG's start date for a local start at ``now`` (pure: see the module doc)."""
    return max(floor_hour(first_start), floor_hour(now) - timedelta(hours=max(catchup_hours, 0)))


def spark_connection(config: Config) -> str:
    """``spark_default``: the master every kdq job of this data folder uses (``Config.spark_master``: the
    loopback standalone master while the stack is a cluster, else ``spark.master``), client mode.

    In the Spark provider's own formats (``SparkSubmitHook._resolve_connection``): a standalone master
    ``spark://host:port`` as the URI ``spark://host:port?deploy-mode=client`` (conn type ``spark``, host and
    port; the compose deployment's ``AIRFLOW_CONN_SPARK_DEFAULT``); any other master (``local[2]``, ``yarn``,
    ``k8s://...``, several standalone masters) as a ``spark`` connection whose host is the master URL itself
    and which has no port."""
    master = config.spark_master()
    standalone = re.fullmatch(r"spark://([^:/,?#]+):(\d+)", master)
    if standalone:
        return f"spark://{standalone.group(1)}:{standalone.group(2)}?deploy-mode=client"
    return json.dumps({"conn_type": "spark", "host": master, "extra": {"deploy-mode": "client"}})


class AirflowApi:
    """The public REST API (``/api/v2``) with a JWT from the simple auth manager's ``POST /auth/token``."""

    def __init__(self, base_url: str, username: str, password: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.timeout = timeout
        self._token: str | None = None

    def token(self) -> str:
        if self._token is None:
            response = requests.post(
                f"{self.base_url}/auth/token",
                json={"username": self.username, "password": self.password},
                timeout=self.timeout,
            )
            if response.status_code != 201:
                raise StackError(f"airflow: login as {self.username} failed: {response.status_code} {response.text}")
            self._token = response.json()["access_token"]
        return self._token

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token()}"}
        return requests.request(method, f"{self.base_url}/api/v2/{path.lstrip('/')}", headers=headers,
                                timeout=self.timeout, **kwargs)

    def get(self, path: str, **params: Any) -> dict:
        response = self.request("GET", path, params=params)
        response.raise_for_status()
        return response.json()

    def latest_run(self, dag_id: str) -> dict | None:
        runs = self.get(f"dags/{dag_id}/dagRuns", order_by="-run_after", limit=1)["dag_runs"]
        return runs[0] if runs else None


class LocalAirflow:
    def __init__(self, config: Config, port: int, paused: bool = False, extra_env: dict[str, str] | None = None) -> None:
        """``paused``: DAGs start paused (tests unpause what they drive); ``make run`` unpauses all."""
        self.config = config
        self.port = port
        self.paused = paused
        self.extra_env = dict(extra_env or {})
        self.home = config.data_dir / "airflow"
        self.settings_file = self.home / "kdq_local.json"
        self.password_file = self.home / "simple_auth_manager_passwords.json.generated"
        # The scheduler's and triggerer's log servers default to fixed ports (8793, 8794) on every
        # interface; free ones let this instance run beside another Airflow (tests beside `make run`).
        self.log_server_ports = (free_port(), free_port())
        self.process = ManagedProcess(
            name="airflow",
            pid_file=self.home / "standalone.pid",
            log_file=self.home / "standalone.log",
            marker=f"--home={self.home}",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- state kept in the Airflow home ------------------------------------------------------------------

    def _settings(self) -> dict:
        """jwt secret and first start, created once per Airflow home."""
        try:
            settings = json.loads(self.settings_file.read_text())
        except FileNotFoundError:
            settings = {}
        if not settings.get("jwt_secret") or not settings.get("first_start"):
            settings = {
                "jwt_secret": settings.get("jwt_secret") or secrets.token_urlsafe(32),
                "first_start": settings.get("first_start") or floor_hour(datetime.now(UTC)).isoformat(),
            }
            self.home.mkdir(parents=True, exist_ok=True)
            self.settings_file.write_text(json.dumps(settings, indent=2))
            self.settings_file.chmod(0o600)
        return settings

    def password(self) -> str:
        """The admin password: generated once, in the file the simple auth manager reads (it keeps existing
        entries), so it is known before Airflow starts and survives restarts."""
        try:
            passwords = json.loads(self.password_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            passwords = {}
        if USERNAME not in passwords:
            passwords[USERNAME] = secrets.token_urlsafe(12)
            self.home.mkdir(parents=True, exist_ok=True)
            self.password_file.write_text(json.dumps(passwords) + "\n")
            self.password_file.chmod(0o600)
        return passwords[USERNAME]

    def start_date(self, now: datetime | None = None) -> str:
        if os.environ.get(START_DATE_ENV, "").strip():
            return os.environ[START_DATE_ENV].strip()
        first = datetime.fromisoformat(self._settings()["first_start"])
        hours = int(os.environ.get(CATCHUP_HOURS_ENV) or DEFAULT_CATCHUP_HOURS)
        return local_start_date(first, now or datetime.now(UTC), hours).isoformat()

    def env(self) -> dict[str, str]:
        """Every Airflow setting of the local instance, as ``AIRFLOW__*`` variables (plus kdq's own)."""
        from kdq.spark.stream_process import child_env

        settings = self._settings()
        env = {
            **child_env(self.config),  # PATH with this venv's bin first: standalone starts `airflow <part>`
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(self.paused),
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.password_file),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            # Shared by the API server (checks) and the scheduler (signs task tokens): one value for all parts.
            "AIRFLOW__API_AUTH__JWT_SECRET": settings["jwt_secret"],
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            # kdq's DAG files change with a kdq upgrade, not while it runs: parsed every 5 minutes instead of
            # Airflow's 30 s (each parse imports the plugin in a process of its own: CPU the stream wants).
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "300",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_server_ports[0]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_server_ports[1]),
            "AIRFLOW_CONN_SPARK_DEFAULT": spark_connection(self.config),
            START_DATE_ENV: self.start_date(),
        }
        if self.config.local_state().get("cluster"):
            # The stream the supervisor submits to the stack's standalone master gets its core cap from here
            # (the tasks load the config themselves); see kdq.stack.spark_cluster.product_caps.
            env |= product_caps_env(self.config)
        # child_env names this stack's config file in KDQ_CONFIG: the DAGs' tasks load the same one.
        return {**env, **self.extra_env}

    # -- running Airflow ---------------------------------------------------------------------------------

    def command(self, *args: str) -> tuple[list[str], dict[str, str]]:
        """Command line and environment of ``airflow <args>`` against this instance (same home, database,
        settings and connections); ``kdq airflow <args>`` runs it."""
        return [str(Path(sys.executable).parent / "airflow"), *args], {**os.environ, **self.env()}

    def cli(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``airflow <args>`` (output captured); raises StackError on a non-zero exit when ``check``."""
        command, env = self.command(*args)
        done = subprocess.run(
            command,
            env=env,
            cwd=self.config.base_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
        if check and done.returncode != 0:
            raise StackError(
                f"airflow {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def migrate(self, timeout: float = 300.0) -> None:
        """Create or upgrade the metadata database (standalone does it too; `airflow dags test` needs it first)."""
        self.password()
        self.cli("db", "migrate", timeout=timeout)

    def health(self, timeout: float = 3.0) -> dict:
        response = requests.get(f"{self.url}/api/v2/monitor/health", timeout=timeout)
        response.raise_for_status()
        return response.json()

    def healthy(self, timeout: float = 3.0) -> bool:
        if not port_open(self.port):
            return False
        health = self.health(timeout)
        parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
        return all((health.get(part) or {}).get("status") == "healthy" for part in parts)

    def api(self) -> AirflowApi:
        return AirflowApi(self.url, USERNAME, self.password())

    def start(self, timeout: float = 300.0) -> None:
        """Start standalone (database migration included) and wait until every part reports healthy."""
        if not self.process.running():
            if port_open(self.port):
                raise StackError(f"airflow: port {self.port} is already in use by another program")
            self.home.mkdir(parents=True, exist_ok=True)
            self.password()
            self.process.start(
                [sys.executable, "-m", "kdq.stack.airflow", "standalone", f"--home={self.home}"],
                env=self.env(),
                cwd=self.config.base_dir,
            )
        wait_until(self.healthy, timeout, "airflow", interval=1.0, alive=self.process.running,
                   log=self.process.log_tail)
        self.ensure_batch_pool()

    def ensure_batch_pool(self, timeout: float = 60.0, pause: float = 2.0) -> None:
        """The batch jobs' pool (:mod:`kdq.airflow_pools`), created once through the REST API: its tasks are not
        scheduled without it. An operator's later change of its slots is kept. A 5xx answer is retried until
        ``timeout``: standalone's SQLite answers 500 "Database error" while another of its parts holds the write
        lock (a `make run` start failed on that once)."""
        api = self.api()
        deadline = time.monotonic() + timeout

        def request(method: str, path: str, **kwargs: Any) -> requests.Response:
            while True:
                response = api.request(method, path, **kwargs)
                if response.status_code < 500 or time.monotonic() + pause > deadline:
                    return response
                time.sleep(pause)

        found = request("GET", f"pools/{BATCH_POOL}")
        if found.status_code == 200:
            return
        if found.status_code != 404:
            raise StackError(f"airflow: reading pool {BATCH_POOL} failed: {found.status_code} {found.text[:300]}")
        made = request(
            "POST", "pools", json={"name": BATCH_POOL, "slots": BATCH_POOL_SLOTS, "description": BATCH_POOL_DESCRIPTION}
        )
        if made.status_code not in (200, 201, 409):  # 409: created meanwhile by another start
            raise StackError(f"airflow: creating pool {BATCH_POOL} failed: {made.status_code} {made.text[:300]}")

    def wait_for_dags(self, dag_ids: tuple[str, ...] = KDQ_DAGS, timeout: float = 180.0) -> None:
        """Until the DAG processor has stored every DAG (the API lists it): triggers need that."""
        api = self.api()

        def listed() -> bool:
            found = {d["dag_id"] for d in api.get("dags", limit=100)["dags"]}
            return set(dag_ids) <= found

        wait_until(listed, timeout, "airflow: DAGs parsed", interval=2.0, alive=self.process.running,
                   log=self.process.log_tail)

    def stop(self, timeout: float = 60.0) -> bool:
        # SIGTERM to the group: standalone and its parts; task processes (their own groups, children of
        # the executor) are stopped by their supervisors, and killed with the rest after the timeout.
        return self.process.stop(timeout=timeout)


# -- the whole product locally (`make run` = `kdq run`) ---------------------------------------------------

SUPERVISOR_DAG = "kdq_stream_supervisor"


def _iso_ms(text: str | None) -> int:
    try:
        return int(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


def _say(started: float, message: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)


def start_product(stack: Any, demo_args: list[str], started: float | None = None) -> float | None:
    """Local stack, Airflow (DAGs unpaused), the stream through its supervisor DAG, demo traffic.

    Returns the start time (``time.monotonic()``) for :func:`follow`, or None when the stack is unhealthy.
    """
    from kdq.traffic.process import start_demo

    started = time.monotonic() if started is None else started
    statuses = stack.up()
    for status in statuses:
        print(status.line(), flush=True)
    if not all(s.healthy for s in statuses):
        return None
    first = not (stack.airflow.home / "airflow.db").exists()
    _say(started, "local stack healthy; starting Airflow standalone" + (" (first start: creates its database)" if first else ""))
    stack.airflow.start()
    stack.airflow.wait_for_dags()
    # Unpaused with catchup=False, the supervisor gets its first run at once; it starts the speed layer.
    _say(started, f"Airflow healthy at {stack.airflow.url}, {len(KDQ_DAGS)} DAGs parsed and unpaused")
    warm_quality_page(stack.airflow.url)
    pid = start_demo(stack.config, demo_args)
    _say(started, f"demo traffic running (pid {pid}, `kdq demo {' '.join(demo_args)}`)")
    return started


def warm_quality_page(url: str) -> None:
    """Ask Airflow's API server to get the data-quality page's numbers ready, as the Airflow UI does when someone
    opens it (it loads the page's navigation icon, plugins/kdq_airflow/quality_app.py): the server's first question
    opens its Spark Connect session and takes seconds, so the first visitor after a start would wait for it
    (benchmarks.local_run: numbers p95 4.2 s in its first phase, from that one load). Best effort: the page asks
    itself when it is opened."""
    try:
        requests.get(f"{url}/kdq/icon.svg", timeout=10)
    except requests.RequestException as exc:
        print(f"the data-quality page was not warmed ({exc}); its first load asks the SQL endpoint itself", flush=True)


def print_banner(stack: Any) -> None:
    from kdq.spark.stream_process import stream_process
    from kdq.traffic.process import demo_process

    airflow = stack.airflow
    spark = getattr(stack, "spark", None)
    shape = (
        f"\n  Spark        {spark.url}   (standalone master, {len(spark.workers)} workers; UI {spark.ui_url})"
        if spark is not None else ""
    )
    print(
        f"""
kdq runs locally{" on the cluster shape (docs/cluster.md)" if spark is not None else ""} (data in {stack.config.data_dir}):
  Airflow UI   {airflow.url}   login: {USERNAME} / {airflow.password()}
  Kafka        {stack.kafka.bootstrap}{shape}
  InfluxDB     {stack.influx.url}   (database {stack.config.influxdb.database})
  Registry     {stack.config.registry_url()}   (Schema Registry, Confluent-compatible API)
  logs         {airflow.process.log_file}
               {stream_process(stack.config).log_file}
               {demo_process(stack.config).log_file}

Look at the results (another terminal):
  .venv/bin/kdq status
  .venv/bin/kdq sql "SELECT topic, status, sum(count) FROM kdq.window_counts GROUP BY 1, 2 ORDER BY 1, 2"
  .venv/bin/kdq sql "SELECT topic, reason, sum(count) FROM kdq.invalid_reason_counts GROUP BY 1, 2 ORDER BY 3 DESC"
  .venv/bin/kdq sql "SELECT * FROM kdq.corrections ORDER BY corrected_at DESC LIMIT 20"
  .venv/bin/kdq airflow dags list-runs kdq_hourly_recompute

Stop everything: Ctrl-C here, or `make stop` in another terminal.
""",
        flush=True,
    )


def follow(stack: Any, started: float, poll_seconds: float = 5.0, report_seconds: float = 60.0) -> None:
    """Print milestones (supervisor run, stream up, first counts), then a status line a minute, until
    Airflow is no longer running (``make stop``) or Ctrl-C (KeyboardInterrupt, handled by the caller)."""
    from kdq.stream.state import stream_status
    from kdq.traffic.process import read_stats

    api = stack.airflow.api()
    pending = {"supervisor": True, "stream": True, "counts": True}
    next_report = time.monotonic() + report_seconds
    # Files of an earlier run of this data folder do not count: only what was written after `started`.
    since_ms = int((time.time() - (time.monotonic() - started)) * 1000)
    while stack.airflow.process.running():
        status = stream_status(stack.config)
        beat, progress = status["heartbeat"] or {}, status["progress"] or {}
        if int(beat.get("time_ms") or 0) < since_ms:
            beat = {}
        if _iso_ms(progress.get("timestamp")) < since_ms:
            progress = {}
        try:
            if pending["supervisor"]:
                run = api.latest_run(SUPERVISOR_DAG)
                # A run of this start: its schedule tick may precede the start by up to one interval.
                recent = run is not None and _iso_ms(run.get("run_after")) >= since_ms - 130_000
                if recent and run["state"] in ("success", "failed"):
                    _say(started, f"{SUPERVISOR_DAG} run {run['state']}")
                    pending["supervisor"] = False
        except Exception as exc:  # the API restarting, a token expiring: report and go on
            print(f"airflow API: {exc}", flush=True)
            api = stack.airflow.api()
        if pending["stream"] and beat.get("state") == "running":
            _say(started, f"speed layer running (pid {beat.get('pid')})")
            pending["stream"] = False
        if pending["counts"] and progress.get("changed_windows") and progress.get("input_rows"):
            _say(started, f"first counts: batch {progress['batch_id']}, {progress['input_rows']} records, "
                          f"{progress['changed_windows']} windows in Delta, the metrics topic and InfluxDB")
            pending["counts"] = False
        if time.monotonic() >= next_report:
            stats = read_stats(stack.config) or {}
            _say(started, f"demo produced {stats.get('produced', 0)}; stream batch {progress.get('batch_id', '-')}, "
                          f"lag {sum((progress.get('consumer_lag') or {}).values())} records")
            next_report = time.monotonic() + report_seconds
        time.sleep(poll_seconds)
    print("Airflow is no longer running (make stop?): stopping the rest", flush=True)


def _standalone(argv: list[str]) -> None:
    """``python -m kdq.stack.airflow standalone --home=<home>``: ``airflow standalone`` in this process.

    The ``--home`` argument only marks the command line, so the pid file can be checked against it
    (:class:`kdq.procs.ManagedProcess`); Airflow takes its home from ``AIRFLOW_HOME``.
    """
    if not argv or argv[0] != "standalone":
        raise SystemExit("usage: python -m kdq.stack.airflow standalone --home=<AIRFLOW_HOME>")
    from airflow.__main__ import main

    sys.argv = ["airflow", "standalone"]
    main()


if __name__ == "__main__":
    _standalone(sys.argv[1:])
