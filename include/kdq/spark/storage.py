"""Tables and checkpoints on a Hadoop FileSystem URI (``paths.storage_uri``): file operations through the
session's JVM, and the start-up check that the URI (and, on s3a://, kdq's DynamoDB log store) can be used.

:class:`HadoopFiles` implements :class:`kdq.storage.Files` with ``org.apache.hadoop.fs.FileSystem``, so
s3a, hdfs, abfs and gs work alike (with their connector jars on the classpath and their settings as
``spark.hadoop.fs.<scheme>.*`` in ``[spark.conf]``). :func:`prepare` runs when a session is built: it
registers the session's :class:`HadoopFiles` for :func:`kdq.storage.files_for`, and probes the storage
root, turning the usual misconfigurations into a :class:`kdq.config.ConfigError` that names the fix.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kdq import storage
from kdq.config import Config, ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class HadoopFiles:
    """:class:`kdq.storage.Files` through Hadoop's FileSystem API in ``spark``'s JVM."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _fs(self, location: storage.Location):
        path = self._jvm.org.apache.hadoop.fs.Path(os.fspath(location))
        return path, path.getFileSystem(self._conf)

    def exists(self, location: storage.Location) -> bool:
        path, fs = self._fs(location)
        return bool(fs.exists(path))

    def names(self, location: storage.Location) -> list[str]:
        path, fs = self._fs(location)
        if not fs.exists(path):
            return []
        return [status.getPath().getName() for status in fs.listStatus(path)]

    def read_bytes(self, location: storage.Location) -> bytes:
        path, fs = self._fs(location)
        if not fs.exists(path):
            raise FileNotFoundError(os.fspath(location))
        stream = fs.open(path)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def mkdirs(self, location: storage.Location) -> None:
        path, fs = self._fs(location)
        fs.mkdirs(path)

    def create_if_absent(self, location: storage.Location, data: bytes) -> bool:
        """A temporary file renamed into place: Hadoop's rename does not replace an existing file (atomic on
        HDFS; on S3A a copy after an existence check, enough for the one starter a checkpoint has)."""
        path, fs = self._fs(location)
        if fs.exists(path):
            return False
        tmp = self._jvm.org.apache.hadoop.fs.Path(path.getParent(), f".{path.getName()}.{os.getpid()}.tmp")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()
        if fs.rename(tmp, path):
            return True
        fs.delete(tmp, False)
        return False

    def write_bytes(self, location: storage.Location, data: bytes) -> None:
        """Overwrite in place: on S3A the object is replaced by one PUT when the stream closes (readers see the old
        or the new one); on HDFS a reader may briefly find it empty (kdq's lease reader takes that as held)."""
        path, fs = self._fs(location)
        out = fs.create(path, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def delete(self, location: storage.Location) -> bool:
        path, fs = self._fs(location)
        return bool(fs.delete(path, False))


# Connector jars of the schemes kdq fetches itself (scripts/setup.sh; docs/cluster.md).
_CONNECTORS = {
    "s3a": "the hadoop-aws and AWS SDK jars: `make setup-s3` fetches them into <paths.jars_dir>/hadoop-aws "
    "(on a cluster: --packages org.apache.hadoop:hadoop-aws:<Hadoop version of Spark>)",
}


def _explain(uri: str, error: str) -> str:
    """What an exception from probing the storage root means for the operator."""
    scheme = storage.scheme(uri) or ""
    prefix = f"paths.storage_uri = {uri!r}: "
    if "No FileSystem for scheme" in error or "ClassNotFoundException" in error:
        needed = _CONNECTORS.get(scheme, f"the Hadoop FileSystem connector jar for {scheme}:// on Spark's classpath")
        return prefix + f"Spark has no FileSystem for {scheme}://; it needs {needed}"
    if scheme == "s3a":
        if any(word in error for word in ("NoAuthWithAWSException", "Unable to load", "credentials", "Credentials")):
            return prefix + (
                "no AWS credentials: set spark.hadoop.fs.s3a.access.key and spark.hadoop.fs.s3a.secret.key (or "
                "spark.hadoop.fs.s3a.aws.credentials.provider) in [spark.conf], or AWS_ACCESS_KEY_ID / "
                f"AWS_SECRET_ACCESS_KEY in the environment ({_first_line(error)})"
            )
        if any(word in error for word in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch")):
            return prefix + f"access denied with the configured credentials ({_first_line(error)})"
        if "UnknownStoreException" in error or "NoSuchBucket" in error:
            return prefix + f"the bucket does not exist ({_first_line(error)})"
        if any(word in error for word in ("Connection refused", "UnknownHost", "Unable to execute HTTP", "connect")):
            return prefix + (
                "cannot reach the S3 endpoint: check spark.hadoop.fs.s3a.endpoint (and fs.s3a.path.style.access, "
                f"fs.s3a.connection.ssl.enabled) in [spark.conf] ({_first_line(error)})"
            )
    return prefix + f"cannot use it: {_first_line(error)}"


def _first_line(error: str) -> str:
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    useful = [line for line in lines if "Exception" in line or "Error" in line] or lines or ["(no message)"]
    return useful[0][:400]


def _explain_log_store(table: str, error: str) -> str:
    """What an exception from starting kdq's DynamoDB log store means for the operator."""
    prefix = f"the DynamoDB log store (paths.dynamodb_table = {table!r}): "
    if "does not exist in the JVM" in error or "ClassNotFoundException" in error or "NoClassDefFoundError" in error:
        return prefix + (
            "its jars are not on Spark's classpath: `make setup-s3` builds kdq-dynamodb.jar and fetches the AWS SDK's "
            f"DynamoDB module into <paths.jars_dir>/hadoop-aws ({_first_line(error)})"
        )
    if any(word in error for word in ("Unable to load credentials", "SdkClientException: Unable to load")):
        return prefix + (
            "no AWS credentials for DynamoDB: the log store uses S3A's keys (spark.hadoop.fs.s3a.access.key / "
            "secret.key), else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the profile or the IAM role "
            f"({_first_line(error)})"
        )
    if any(word in error for word in ("AccessDenied", "not authorized", "UnrecognizedClient", "403")):
        return prefix + (
            "access denied: the credentials need dynamodb:DescribeTable, GetItem, PutItem and Query on the table "
            f"(and CreateTable if kdq is to make it) ({_first_line(error)})"
        )
    if any(word in error for word in ("Unable to execute HTTP", "Connection refused", "UnknownHost", "connect")):
        return prefix + (
            f"cannot reach DynamoDB: check paths.dynamodb_region and paths.dynamodb_endpoint ({_first_line(error)})"
        )
    return prefix + f"cannot use it: {_first_line(error)}"


def _start_log_store(spark: SparkSession) -> None:
    """Start kdq's DynamoDB log store once, as Delta will: it reaches DynamoDB and makes the table (on-demand) if it
    does not exist yet. A wrong table, region, endpoint or credential stops the job here, by name, not at its first
    commit."""
    if spark.conf.get(storage.S3A_LOG_STORE_KEY, "") != storage.DYNAMODB_LOG_STORE:
        return
    table = spark.conf.get(f"{storage.DYNAMODB_PREFIX}table", "kdq_delta_log")
    try:
        hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()
        spark._jvm.io.kdq.storage.DynamoDBLogStore(hadoop_conf)
    except Exception as exc:  # py4j surfaces the JVM's exceptions as generic ones
        raise ConfigError(_explain_log_store(table, str(exc))) from None


def prepare(spark: SparkSession, config: Config) -> None:
    """Register this session's Hadoop FileSystem for remote locations, and (with ``paths.storage_uri`` set)
    check that the storage root can be listed and written, and that the DynamoDB log store (when configured)
    reaches its table: a bad setting stops the job here, by name."""
    uri = config.paths.storage_uri
    if not uri or not storage.is_remote(uri):
        return
    files = HadoopFiles(spark)
    root = storage.storage_root(config)
    try:
        files.mkdirs(root)
        files.names(root)
    except Exception as exc:  # py4j surfaces the JVM's exceptions as generic ones
        raise ConfigError(_explain(uri, str(exc))) from None
    if storage.scheme(uri) == "s3a":
        _start_log_store(spark)
    storage.use_remote_files(files)
