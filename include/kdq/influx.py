"""Writing window counts to InfluxDB 1.x (database/retention policy) or 2.x/3.x (org/bucket/token).

A point is keyed by measurement (the topic), tag set (none for counts) and
timestamp (window start), so rewriting a window's point with corrected
values replaces it: pushes are idempotent and can be repeated safely.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import requests

from kdq.config import Config, redact_text

log = logging.getLogger(__name__)


class InfluxWriteError(RuntimeError):
    """InfluxDB did not accept the points after every retry."""


@dataclass(frozen=True)
class Point:
    measurement: str
    time_ms: int
    fields: Mapping[str, int | float | str | bool]
    tags: Mapping[str, str] = field(default_factory=dict)


def _escape_key(text: str) -> str:
    return text.replace("\\", "\\\\").replace(",", r"\,").replace(" ", r"\ ").replace("=", r"\=")


def _field_value(value: int | float | str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        return repr(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def line_protocol(point: Point) -> str:
    measurement = point.measurement.replace("\\", "\\\\").replace(",", r"\,").replace(" ", r"\ ")
    tags = "".join(f",{_escape_key(k)}={_escape_key(v)}" for k, v in sorted(point.tags.items()) if v != "")
    fields = ",".join(f"{_escape_key(k)}={_field_value(v)}" for k, v in point.fields.items())
    return f"{measurement}{tags} {fields} {point.time_ms}"


def count_points(rows: Iterable[Mapping]) -> list[Point]:
    """Window-count rows (topic, window_start_ms, valid, invalid) → one point per window.

    Both fields are always written, a missing status as 0, so a dashboard
    query `select valid, invalid` never shows a null for a window that exists.
    """
    return [
        Point(row["topic"], int(row["window_start_ms"]), {"valid": int(row["valid"] or 0), "invalid": int(row["invalid"] or 0)})
        for row in rows
    ]


class InfluxSink:
    """Batched, retried writes with exponential backoff; raises InfluxWriteError when all retries fail."""

    def __init__(self, config: Config, batch_size: int = 5000) -> None:
        self.settings = config.influxdb
        self.url = config.influx_url().rstrip("/")
        self.batch_size = batch_size

    def write(self, points: Sequence[Point]) -> int:
        for start in range(0, len(points), self.batch_size):
            body = "\n".join(line_protocol(p) for p in points[start : start + self.batch_size])
            self._with_retries(body)
        return len(points)

    def _with_retries(self, body: str) -> None:
        attempts = self.settings.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                self._send(body)
                return
            except Exception as exc:
                # influxdb.url may carry user:password@: quoted without it (task logs, job reports).
                if attempt == attempts:
                    raise InfluxWriteError(
                        redact_text(f"InfluxDB at {self.url} rejected or missed a write after {attempts} attempts: {exc}")
                    ) from exc
                delay = min(0.5 * 2 ** (attempt - 1), 8.0)
                log.warning("InfluxDB write failed (attempt %d/%d): %s; retrying in %.1fs", attempt, attempts,
                            redact_text(str(exc)), delay)
                time.sleep(delay)

    def _send(self, body: str) -> None:
        if self.settings.version == 1:
            params = {"db": self.settings.database, "precision": "ms"}
            if self.settings.retention_policy:
                params["rp"] = self.settings.retention_policy
            auth = (self.settings.username, self.settings.password) if self.settings.username else None
            response = requests.post(
                f"{self.url}/write", params=params, data=body.encode(), auth=auth, timeout=self.settings.timeout_seconds
            )
            if response.status_code != 204:
                raise InfluxWriteError(f"HTTP {response.status_code}: {response.text[:300]}")
            return
        from influxdb_client import InfluxDBClient, WritePrecision
        from influxdb_client.client.write_api import SYNCHRONOUS

        with InfluxDBClient(
            url=self.url,
            token=self.settings.token,
            org=self.settings.org,
            timeout=int(self.settings.timeout_seconds * 1000),
        ) as client:
            client.write_api(write_options=SYNCHRONOUS).write(
                bucket=self.settings.bucket, org=self.settings.org, record=body, write_precision=WritePrecision.MS
            )
