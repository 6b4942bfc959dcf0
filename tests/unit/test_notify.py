"""kdq.notify: each (notification, channel) pair is sent once, failures are retried with backoff, a dead
channel is skipped for the rest of the run without stopping the others, and settings are checked."""

from __future__ import annotations

import json

import pytest

from kdq.notify import (
    ChannelError,
    SmtpChannel,
    WebhookChannel,
    channels_from_json,
    deliver,
    email_message,
    webhook_body,
)


class Recorder:
    def __init__(self, name: str, fail_times: int = 0) -> None:
        self.name, self.fail_times, self.sent, self.calls = name, fail_times, [], 0

    def send(self, notification) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise OSError("connection refused")
        self.sent.append(notification["notification_id"])


def note(i: int) -> dict:
    payload = {"status": "open", "topic": "orders", "expectation": "invalid_ratio", "worst_value": 0.4}
    return {"notification_id": f"orders|invalid_ratio|k#v{i}:open", "event": "open", "topic": "orders",
            "expectation": "invalid_ratio", "payload": json.dumps(payload)}


def test_each_pair_once_retries_with_backoff_and_already_sent_ones_are_skipped() -> None:
    mail, hook, waits = Recorder("mail", fail_times=2), Recorder("hook"), []
    notes = [note(1), note(2)]
    result = deliver(notes, [mail, hook], {(notes[0]["notification_id"], "hook")}, attempts=3,
                     backoff_seconds=0.5, sleep=waits.append)
    assert mail.sent == [n["notification_id"] for n in notes] and hook.sent == [notes[1]["notification_id"]]
    assert waits == [0.5, 1.0]  # exponential backoff between the tries of the first mail
    assert sorted((c, a) for _, c, a in result.delivered) == [("hook", 1), ("mail", 1), ("mail", 3)]
    sent = {(n, c) for n, c, _ in result.delivered} | {(notes[0]["notification_id"], "hook")}
    again = deliver(notes, [mail, hook], sent, sleep=waits.append)  # a re-run: nothing left to send
    assert again.delivered == [] and len(mail.sent) == 2


def test_a_dead_channel_is_given_up_for_the_run_and_the_others_still_deliver() -> None:
    dead, hook = Recorder("mail", fail_times=99), Recorder("hook")
    result = deliver([note(1), note(2), note(3)], [dead, hook], set(), attempts=2, sleep=lambda s: None)
    assert len(hook.sent) == 3 and dead.calls == 2
    assert result.failed == {"mail": 1} and result.deferred == {"mail": 2}
    assert result.summary(0)["sent"] == {"hook": 3} and "OSError" in result.errors[0]


def test_channel_settings_and_messages() -> None:
    channels = channels_from_json(json.dumps([
        {"name": "mail", "kind": "smtp", "host": "smtp.example", "port": 25, "from": "kdq@example",
         "to": "team@example", "ssl": False, "starttls": False, "password": "secret"},
        {"name": "hook", "kind": "webhook", "url": "http://hooks.example/x", "headers": {"Authorization": "t"}},
    ]))
    assert channels[0] == SmtpChannel("mail", "smtp.example", 25, "kdq@example", ("team@example",), None, "secret",
                                      False, False)
    assert isinstance(channels[1], WebhookChannel) and "secret" not in repr(channels) and "'t'" not in repr(channels)
    assert channels_from_json("") == []
    with pytest.raises(ChannelError, match="smtp needs host"):
        channels_from_json('[{"kind": "smtp", "host": "h"}]')
    with pytest.raises(ChannelError, match="kind must be"):
        channels_from_json('[{"kind": "pager"}]')
    message = email_message(note(1), "kdq@example", ["team@example"])
    assert message["Subject"] == "[kdq] open: orders invalid_ratio (open)"
    assert message["X-Kdq-Notification-Id"] == note(1)["notification_id"] and "worst_value: 0.4" in message.get_content()
    assert webhook_body(note(1))["id"] == note(1)["notification_id"] and webhook_body(note(1))["status"] == "open"
