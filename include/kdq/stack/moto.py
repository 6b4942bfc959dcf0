"""A local S3 and DynamoDB on loopback (moto's server) for the s3a:// variant of the chaos run.

moto stands in for AWS as in the s3a integration tests (``tests/integration/test_cluster_s3.py``): one
process serves S3 and DynamoDB on one port. :class:`LocalS3` starts it, makes the bucket and the DynamoDB
table of kdq's log store (made as docs/cluster.md makes it on AWS: on-demand, key (tablePath, fileName),
TTL on expireTime), and gives the kdq settings that put the tables and checkpoints there
(:meth:`LocalS3.settings`). Needs ``make setup-s3`` (the S3A connector and kdq's DynamoDB log store jars).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ACCESS_KEY, SECRET_KEY = "kdq-local-key", "kdq-local-secret"  # moto accepts any; nothing real behind them
REGION = "us-east-1"


class LocalS3:
    def __init__(self, port: int, log_file: Path, bucket: str = "kdq-local", dynamodb_table: str = "kdq_delta_log") -> None:
        self.port = port
        self.log_file = log_file
        self.bucket = bucket
        self.dynamodb_table = dynamodb_table
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _client(self, service: str):
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def start(self, timeout: float = 30.0) -> str:
        """Start the server, wait for its port (deadline ``timeout``), make the bucket and the log store's table."""
        server = Path(sys.executable).parent / "moto_server"
        command = [str(server) if server.exists() else shutil.which("moto_server") or "moto_server",
                   "-H", "127.0.0.1", "-p", str(self.port)]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not open port {self.port}: {self.log_file.read_text()[-2000:]}") from None
                time.sleep(0.2)
        self._client("s3").create_bucket(Bucket=self.bucket)
        dynamodb = self._client("dynamodb")
        dynamodb.create_table(
            TableName=self.dynamodb_table,
            AttributeDefinitions=[{"AttributeName": "tablePath", "AttributeType": "S"},
                                  {"AttributeName": "fileName", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "tablePath", "KeyType": "HASH"}, {"AttributeName": "fileName", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
        dynamodb.get_waiter("table_exists").wait(TableName=self.dynamodb_table, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
        dynamodb.update_time_to_live(TableName=self.dynamodb_table,
                                     TimeToLiveSpecification={"Enabled": True, "AttributeName": "expireTime"})
        return self.endpoint

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def settings(self, prefix: str = "kdq") -> dict[str, dict[str, Any]]:
        """kdq config sections (``paths``, ``spark.conf``) for tables and checkpoints under
        ``s3a://<bucket>/<prefix>``, committed through kdq's DynamoDB log store on this server."""
        return {
            "paths": {"storage_uri": f"s3a://{self.bucket}/{prefix}", "dynamodb_table": self.dynamodb_table,
                      "dynamodb_region": REGION, "dynamodb_endpoint": self.endpoint},
            "spark_conf": {
                "spark.hadoop.fs.s3a.endpoint": self.endpoint,
                "spark.hadoop.fs.s3a.endpoint.region": REGION,
                "spark.hadoop.fs.s3a.path.style.access": "true",
                "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
                "spark.hadoop.fs.s3a.access.key": ACCESS_KEY,
                "spark.hadoop.fs.s3a.secret.key": SECRET_KEY,
            },
        }
