"""Batch intervals of ingest time, in epoch millis (pure Python: used by the jobs, the CLI and DAGs)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from kdq.windows import HOUR_MS


def batch_app_id(interval_start_ms: int) -> str:
    """Delta idempotent-write app id of the batch layer's run for an interval (counts and summaries)."""
    return f"kdq-batch-{int(interval_start_ms)}"


def parse_time_ms(text: str) -> int:
    """Epoch millis (digits) or ISO-8601 (``2023-11-14T22:00:00Z``); an ISO time without a zone is UTC."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"expected epoch millis or ISO-8601, got {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def resolve_interval(start_ms: int | None, end_ms: int | None, now_ms: int | None = None) -> tuple[int, int]:
    """Defaults: end = the start of the current UTC hour, start = end - 1 h. Rejects empty intervals."""
    if end_ms is None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        end_ms = now // HOUR_MS * HOUR_MS
    if start_ms is None:
        start_ms = end_ms - HOUR_MS
    if start_ms >= end_ms:
        raise ValueError(f"interval start ({start_ms}) must be before its end ({end_ms})")
    return int(start_ms), int(end_ms)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
