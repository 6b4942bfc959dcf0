"""The always-on SQL endpoint: one Spark driver serving the kdq tables to SQL clients over the wire.

    spark-submit spark_jobs/sql_endpoint.py [--config kdq.toml] --connect-port P [--thrift-port Q] [--host H]

Spark Connect (``sc://host:P``) and the Thrift server (HiveServer2, ``jdbc:hive2://host:Q/kdq``) from
one session, opened only after every kdq table and view is registered (see kdq.spark.sql_server).
Runs until SIGTERM (``kdq down``), then stops both servers and the session and prints its report
(kdq.job_reports.EndpointReport).

main(argv) → args → frozen config → session (with the read-only rule) → kdq.spark.sql_server.serve (arms it,
then opens the ports) → report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdq.config import Config
from kdq.job_reports import EndpointReport
from kdq.jobs import run_main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sql_endpoint", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--host", default="127.0.0.1", help="address both servers bind to")
    parser.add_argument("--connect-port", type=int, required=True, help="Spark Connect (gRPC) port")
    parser.add_argument("--thrift-port", type=int, default=0, help="HiveServer2 port (0: no Thrift server)")
    return parser.parse_args(argv)


APP_NAME = "kdq-sql-endpoint"


def session_conf(config: Config) -> dict[str, str]:
    """The endpoint's own session settings over kdq's: the read-only rule (``io.kdq.spark.sqlendpoint.ReadOnlyExtension``)
    after Delta's extension, and Spark Connect's read-only interceptor; the same as on the spark-submit command of
    kdq.stack.sql_endpoint, whose ``spark.sql.extensions`` the session factory's own would otherwise replace; and the
    client sessions' small-query defaults, which the Thrift server copies from this session into every statement."""
    from kdq.spark.session import spark_conf
    from kdq.stack.sql_endpoint import CLIENT_SESSION_DEFAULTS, read_only_conf

    return {**read_only_conf(spark_conf(config, APP_NAME)), **CLIENT_SESSION_DEFAULTS}


def run(spark, config: Config, args: argparse.Namespace) -> EndpointReport:
    """Serve in an existing session until SIGTERM; returns its report."""
    import os

    from kdq.spark.session import exit_when_jvm_dies
    from kdq.spark.sql_server import serve
    from kdq.stack.sql_endpoint import TLS_KEYSTORE_PASSWORD_ENV

    # A container stop or `kill` reaches the spark-submit JVM: the driver must not stay behind without it.
    exit_when_jvm_dies(spark)
    return serve(spark, config, args.host, args.connect_port, args.thrift_port,
                 keystore_password=os.environ.get(TLS_KEYSTORE_PASSWORD_ENV) or None)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name=APP_NAME, session_conf=session_conf)


if __name__ == "__main__":
    sys.exit(main())
