"""spark-submit's arguments for kdq's jobs: secrets of [spark.conf] stay off the command line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from kdq.spark.submit import SECRET_KEY, submission, submit_command
from tests.conftest import PROJECT_ROOT, make_config

SECRETS = {
    "spark.hadoop.fs.s3a.access.key": "AKIA-key",
    "spark.hadoop.fs.s3a.secret.key": "s3cr3t=with:all#the!special \\ chars é",
    "spark.kdq.some.password": "  padded",
    "spark.kdq.token": "tok-9f3e",
}

# java.util.Properties reads the file back, as spark-submit does (Utils.getPropertiesFromFile: a UTF-8 reader).
READ_PROPERTIES = """
import java.io.*; import java.nio.charset.StandardCharsets; import java.util.*;
public class ReadProperties {
  public static void main(String[] args) throws Exception {
    Properties p = new Properties();
    try (Reader r = new InputStreamReader(new FileInputStream(args[0]), StandardCharsets.UTF_8)) { p.load(r); }
    StringBuilder out = new StringBuilder("{");
    for (String k : new TreeSet<>(p.stringPropertyNames())) {
      if (out.length() > 1) out.append(",");
      out.append(quote(k)).append(":").append(quote(p.getProperty(k)));
    }
    System.out.println(out.append("}"));
  }
  static String quote(String s) {
    StringBuilder b = new StringBuilder("\\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\\\') b.append('\\\\').append(c);
      else if (c < 0x20 || c > 0x7e) b.append(String.format("\\\\u%04x", (int) c));
      else b.append(c);
    }
    return b.append("\\"").toString();
  }
}
"""


def _config(tmp_path: Path, master: str = "local[2]"):
    return make_config(tmp_path, spark={"master": master, "conf": {**SECRETS, "spark.sql.adaptive.enabled": "false"}})


def test_secret_keys_follow_sparks_redaction_default() -> None:
    assert all(SECRET_KEY.search(key) for key in SECRETS)
    assert not SECRET_KEY.search("spark.hadoop.fs.s3a.endpoint") and not SECRET_KEY.search("spark.executor.cores")


def test_secrets_go_to_a_private_properties_file_not_the_command_line(tmp_path: Path) -> None:
    config = _config(tmp_path)
    command = submit_command(config, "batch_recompute", ["--start=0"])
    line = " ".join(command)
    for key, value in SECRETS.items():
        assert key not in line and value not in line
    assert "--conf spark.sql.adaptive.enabled=false" in line, "other settings stay --conf"
    path = Path(command[command.index("--properties-file") + 1])
    assert "--load-spark-defaults" in command, "conf/spark-defaults.conf still applies"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.parent == config.data_dir / "spark-submit"
    # Same secrets, same file (concurrent submits share it); another secret, another file.
    assert submission(config, "stream_counts").properties_file == path
    other = make_config(tmp_path, spark={"conf": {"spark.kdq.token": "other"}})
    assert submission(other, "stream_counts").properties_file not in (None, path)


def test_java_reads_back_every_secret_verbatim(tmp_path: Path) -> None:
    path = submission(_config(tmp_path), "batch_recompute").properties_file
    source = tmp_path / "ReadProperties.java"
    source.write_text(READ_PROPERTIES)
    done = subprocess.run(["java", str(source), str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == SECRETS


def test_no_secrets_no_file(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    command = submit_command(config, "batch_recompute", [])
    assert "--properties-file" not in command
    assert not (config.data_dir / "spark-submit").exists() or not list((config.data_dir / "spark-submit").glob("secrets-*"))


def test_the_file_is_private_from_its_first_byte(tmp_path: Path) -> None:
    """Created with mode 0600 (never world-readable, even for a moment), whatever the umask."""
    previous = os.umask(0)
    try:
        path = submission(_config(tmp_path), "batch_recompute").properties_file
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# chrt (util-linux) and nice (coreutils) are in every Debian base system, the machines this project runs on; then the
# job's own session at a low CPU weight (kdq.background_session).
BATCH_PREFIX = ["chrt", "--idle", "0", "nice", "-n", "10", sys.executable,
                str(PROJECT_ROOT / "include" / "kdq" / "background_session.py"), "19"]


def test_the_maintenance_stays_in_the_background(tmp_path: Path) -> None:
    """The daily maintenance never takes the cores the stream and the SQL endpoint need: one core
    (local[1] for a local master, spark.cores.max=1 on a cluster) and its spark-submit under nice; the other
    batch jobs run under nice with every core; the stream and the SQL endpoint at their parent's priority. On
    Linux every batch job is also in the SCHED_IDLE class (chrt --idle 0)."""
    config = _config(tmp_path)  # local[2]
    command = submit_command(config, "maintenance", ["--archive-retention-days=30"])
    assert command[:9] == BATCH_PREFIX and command[9].endswith("spark-submit")
    assert command[command.index("--master") + 1] == "local[1]"
    assert "spark.cores.max=1" in command
    recompute = submit_command(config, "batch_recompute", ["--start=0"])
    assert recompute[:9] == BATCH_PREFIX and recompute[9].endswith("spark-submit")
    assert recompute[recompute.index("--master") + 1] == "local[2]"
    assert not any(arg.startswith("spark.cores.max=") for arg in recompute)
    for long_running in ("stream_counts", "sql_endpoint"):
        assert submit_command(config, long_running, [])[0].endswith("spark-submit")

    cluster = submission(_config(tmp_path, master="spark://10.0.0.5:7077"), "maintenance")
    assert cluster.master == "spark://10.0.0.5:7077" and cluster.conf["spark.cores.max"] == "1"


def test_capped_master() -> None:
    from kdq.spark.submit import capped_master

    assert [capped_master(m, "maintenance") for m in ("local", "local[2]", "local[*]", "local[4,2]")] == ["local[1]"] * 4
    for master in ("spark://h:7077", "yarn", "k8s://https://h", "local-cluster[2,1,1024]"):
        assert capped_master(master, "maintenance") == master
    assert capped_master("local[2]", "batch_recompute") == "local[2]"


def test_the_airflow_operator_submits_the_maintenance_in_the_background(tmp_path: Path, monkeypatch) -> None:
    """The same cap and priority when Airflow submits it: the hook's command (built by the Spark provider from
    the connection, here local[2]) starts with nice and names local[1]."""
    import sys

    from tests.conftest import PROJECT_ROOT

    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    from kdq_airflow.operators import _report_hook, submit_settings

    assert "kdq_airflow.operators" in sys.modules
    config = _config(tmp_path)
    hook = _report_hook(job="maintenance", conn_id="spark_default", application_args=[], **submit_settings(config, "maintenance"))
    command = hook._build_spark_submit_command("maintenance.py")
    assert command[:9] == BATCH_PREFIX and command[command.index("--master") + 1] == "local[1]"
    assert "spark.cores.max=1" in command
    other = _report_hook(job="batch_recompute", conn_id="spark_default", application_args=[], **submit_settings(config, "batch_recompute"))
    command = other._build_spark_submit_command("batch_recompute.py")
    assert command[:9] == BATCH_PREFIX and command[command.index("--master") + 1] == "local[2]"
    stream = _report_hook(job="stream_counts", conn_id="spark_default", application_args=[], **submit_settings(config, "stream_counts"))
    assert stream._build_spark_submit_command("stream_counts.py")[0] not in ("nice", "chrt")


def test_a_batch_job_really_runs_in_the_idle_class() -> None:
    """The prefix does what it says: a process started under it is SCHED_IDLE at niceness +10 (what a batch
    job's spark-submit, its JVM and its threads inherit), in a session of its own whose autogroup has niceness 19
    (docs/operations.md "CPU priorities")."""
    import subprocess

    from kdq.spark.submit import priority_prefix

    probe = ("import os; print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.nice(0), os.getsid(0) == os.getpid(), "
             "open('/proc/self/autogroup').read().split()[-1] if os.path.exists('/proc/self/autogroup') else '-')")
    out = subprocess.run([*priority_prefix("batch_recompute"), sys.executable, "-c", probe], capture_output=True,
                         text=True, check=True, timeout=30).stdout.split()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    expected_weight = "19" if autogroup.exists() and autogroup.read_text().strip() == "1" else out[-1]
    assert out == ["True", str(min(os.nice(0) + 10, 19)), "True", expected_weight], out
    # The expectations run is due within the minute: nice, not the idle class.
    assert priority_prefix("evaluate_expectations") == ["nice", "-n", "10"]
