"""Sending incident notifications: channels, retries with backoff, and which ones are still due.

A notification (a row of the outbox ``kdq.incident_notifications``) goes to every configured channel once:
:func:`deliver` sends each (notification, channel) pair that has no delivery yet, retries a failure with
exponential backoff, and returns the pairs it delivered, which the caller records in
``kdq.incident_deliveries`` so that no later run, retry or replay sends them again. A channel that still fails
after its retries is skipped for the rest of the run (its pairs stay due for the next run): a dead mail server
must not hold the evaluation schedule for minutes of timeouts, and it never fails the evaluation.

Between a successful send and its recorded delivery there is a gap no channel can close (SMTP and HTTP have
no two-phase commit): a run that dies there sends that notification again on the next run. Every message
carries the notification id (the email's ``Message-ID`` and ``X-Kdq-Notification-Id``, the webhook's
``Idempotency-Key`` header and ``id`` field) so a receiver can drop such a repeat.

Channels are plain settings (:func:`channels_from_json`), given to the job in the environment variable
``KDQ_NOTIFY_CHANNELS`` (secrets never on a command line); the Airflow operator builds them from Airflow
connections (``kdq_airflow.operators.channels_from_connections``).
"""

from __future__ import annotations

import json
import logging
import smtplib
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

log = logging.getLogger(__name__)

CHANNELS_ENV = "KDQ_NOTIFY_CHANNELS"


class ChannelError(ValueError):
    """A channel setting that cannot work (no host, no recipient, an unknown kind)."""


@dataclass(frozen=True)
class SmtpChannel:
    """Email through an SMTP server. ``ssl``: connect over TLS (SMTPS); ``starttls``: upgrade a plain
    connection (the Airflow SMTP connection's ``disable_ssl`` / ``disable_tls`` extras, same defaults)."""

    name: str
    host: str
    port: int
    sender: str
    recipients: tuple[str, ...]
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = True
    starttls: bool = True
    timeout: float = 10.0

    def send(self, notification: Mapping[str, Any]) -> None:
        message = email_message(notification, self.sender, self.recipients)
        if self.ssl:
            client: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout,
                                                    context=ssl.create_default_context())
        else:
            client = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        with client:
            if not self.ssl and self.starttls:
                client.starttls(context=ssl.create_default_context())
            if self.login:
                client.login(self.login, self.password or "")
            client.send_message(message)


@dataclass(frozen=True)
class WebhookChannel:
    """An HTTP POST of the notification as JSON; any 2xx answer is a delivery."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # e.g. an Authorization header
    timeout: float = 10.0

    def send(self, notification: Mapping[str, Any]) -> None:
        import requests

        headers = {**self.headers, "Idempotency-Key": str(notification["notification_id"])}
        answer = requests.post(self.url, json=webhook_body(notification), headers=headers, timeout=self.timeout)
        if not 200 <= answer.status_code < 300:
            raise OSError(f"webhook answered HTTP {answer.status_code}")


Channel = SmtpChannel | WebhookChannel


def channels_from_json(text: str | None) -> list[Channel]:
    """Channels from ``$KDQ_NOTIFY_CHANNELS``: a JSON list of objects, each ``{"name", "kind": "smtp", "host",
    "port", "from", "to": [...], "login", "password", "ssl", "starttls"}`` or ``{"name", "kind": "webhook",
    "url", "headers"}``. Empty or unset: no channel (notifications wait in the outbox)."""
    if not text or not text.strip():
        return []
    out: list[Channel] = []
    for index, spec in enumerate(json.loads(text), start=1):
        kind, name = spec.get("kind"), spec.get("name") or f"channel{index}"
        if kind == "smtp":
            recipients = spec.get("to") or []
            recipients = [recipients] if isinstance(recipients, str) else list(recipients)
            if not spec.get("host") or not recipients or not spec.get("from"):
                raise ChannelError(f"notification channel {name!r}: smtp needs host, from and to")
            out.append(SmtpChannel(name, spec["host"], int(spec.get("port") or 465), spec["from"], tuple(recipients),
                                   spec.get("login"), spec.get("password"), bool(spec.get("ssl", True)),
                                   bool(spec.get("starttls", True)), float(spec.get("timeout", 10))))
        elif kind == "webhook":
            if not spec.get("url"):
                raise ChannelError(f"notification channel {name!r}: webhook needs url")
            out.append(WebhookChannel(name, spec["url"], dict(spec.get("headers") or {}), float(spec.get("timeout", 10))))
        else:
            raise ChannelError(f"notification channel {name!r}: kind must be 'smtp' or 'webhook', got {kind!r}")
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ChannelError(f"notification channels must have distinct names, got {names}")
    return out


def _incident(notification: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(notification["payload"]) if notification.get("payload") else {}


def webhook_body(notification: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a webhook receives: the incident row as of the change, with ``id`` and ``event``."""
    return {"id": notification["notification_id"], "event": notification["event"], **_incident(notification)}


def email_message(notification: Mapping[str, Any], sender: str, recipients: Sequence[str]) -> EmailMessage:
    incident = _incident(notification)
    message = EmailMessage()
    message["Subject"] = (f"[kdq] {notification['event']}: {notification['topic']} {notification['expectation']} "
                          f"({incident.get('status', '?')})")
    message["From"] = sender
    message["To"] = ", ".join(recipients)
    safe_id = "".join(ch if ch.isalnum() or ch in ".-_" else "-" for ch in str(notification["notification_id"]))
    message["Message-ID"] = f"<{safe_id}@kdq>"
    message["X-Kdq-Notification-Id"] = str(notification["notification_id"])
    lines = [f"{key}: {incident[key]}" for key in (
        "topic", "expectation", "status", "worst_value", "threshold", "level", "first_window", "last_window",
        "window_start", "window_end", "resolved_window", "final", "incident_key", "version", "sample",
    ) if incident.get(key) is not None]
    message.set_content(f"kdq incident {notification['event']}\n\n" + "\n".join(lines) + "\n")
    return message


@dataclass
class DeliveryResult:
    delivered: list[tuple[str, str, int]] = field(default_factory=list)  # (notification_id, channel, attempts)
    failed: dict[str, int] = field(default_factory=dict)  # per channel: pairs given up on in this run
    deferred: dict[str, int] = field(default_factory=dict)  # per channel: not tried after the channel failed
    errors: list[str] = field(default_factory=list)

    def summary(self, already_sent: int) -> dict[str, Any]:
        sent: dict[str, int] = {}
        for _, channel, _ in self.delivered:
            sent[channel] = sent.get(channel, 0) + 1
        return {"sent": sent, "failed": self.failed, "deferred": self.deferred,
                "skipped_already_sent": already_sent, "errors": self.errors[:20]}


def _error_text(channel: Channel, exc: Exception) -> str:
    """What a failure says in logs and the report. requests' errors quote the URL's path and query, where a
    webhook may carry its token, so a webhook's failure is named by its class (and our own HTTP status)."""
    if isinstance(channel, WebhookChannel) and not str(exc).startswith("webhook answered"):
        return type(exc).__name__
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def deliver(
    notifications: Iterable[Mapping[str, Any]],
    channels: Sequence[Channel],
    already_sent: set[tuple[str, str]],
    *,
    attempts: int = 3,
    backoff_seconds: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> DeliveryResult:
    """Send every (notification, channel) pair not in ``already_sent``, in the notifications' order; each
    failure is retried ``attempts`` times in all, waiting backoff, 2 x backoff, ... between tries."""
    result = DeliveryResult()
    broken: set[str] = set()
    for notification in notifications:
        nid = str(notification["notification_id"])
        for channel in channels:
            if (nid, channel.name) in already_sent:
                continue
            if channel.name in broken:
                result.deferred[channel.name] = result.deferred.get(channel.name, 0) + 1
                continue
            for attempt in range(1, attempts + 1):
                try:
                    channel.send(notification)
                    result.delivered.append((nid, channel.name, attempt))
                    break
                except Exception as exc:  # any failure of a channel is its own, never the run's
                    error = f"{channel.name}: {nid}: attempt {attempt}: {_error_text(channel, exc)}"
                    log.warning("notification not delivered: %s", error)
                    result.errors.append(error)
                    if attempt == attempts:
                        result.failed[channel.name] = result.failed.get(channel.name, 0) + 1
                        broken.add(channel.name)
                    else:
                        sleep(backoff_seconds * 2 ** (attempt - 1))
    return result
