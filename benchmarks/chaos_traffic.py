"""The chaos run's traffic: a transactional producer of :mod:`benchmarks.chaos_logic`'s records at a fixed rate
(see :mod:`benchmarks.chaos`)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter

from benchmarks import chaos_logic as cl
from benchmarks.chaos_setup import _now
from kdq.config import Config

log = logging.getLogger("kdq.chaos")


class Traffic(threading.Thread):
    """A transactional producer at a fixed rate (kdq.traffic.generator.RateLimiter); broker outages abort or fail
    transactions, which is fine: the truth is what Kafka holds committed at the end."""

    def __init__(self, config: Config, seed: int, rate: float, mix: cl.TrafficMix, transaction_seconds: float,
                 abort_ratio: float) -> None:
        super().__init__(name="chaos-traffic", daemon=True)
        self.config = config
        self.generator = cl.ChaosTraffic(seed, mix)
        self.rng = random.Random(seed + 3)
        self.rate = rate
        self.transaction_seconds = transaction_seconds
        self.abort_ratio = abort_ratio
        self.stop = threading.Event()
        self.transactional_id = f"kdq-chaos-{seed}"
        self.stats: Counter = Counter()
        self.errors: list[str] = []
        self.error: BaseException | None = None

    def _producer(self):
        from confluent_kafka import Producer

        deadline = _now() + 300
        while True:
            producer = Producer({
                **self.config.kafka_client_conf(),
                "transactional.id": self.transactional_id,
                "linger.ms": 20,
                "message.max.bytes": 2_000_000,
                "transaction.timeout.ms": 60_000,
            })
            try:
                producer.init_transactions(30)
                return producer
            except Exception as exc:  # the broker may be restarting
                self._note(f"init_transactions: {exc}")
                if _now() > deadline or self.stop.is_set():
                    raise
                time.sleep(2)

    def _note(self, message: str) -> None:
        self.stats["errors"] += 1
        if len(self.errors) < 200:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {message}")
        log.warning("producer: %s", message)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the driver
            self.error = exc
            log.exception("traffic failed")

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        from kdq.traffic.generator import RateLimiter

        producer = self._producer()
        limiter = RateLimiter(self.rate)
        while not self.stop.is_set():
            abort = self.rng.random() < self.abort_ratio
            intent = "abort" if abort else "commit"
            count = 0
            try:
                producer.begin_transaction()
                end = _now() + self.transaction_seconds
                while _now() < end and not self.stop.is_set():
                    due = limiter.due()
                    now_ms = int(time.time() * 1000)
                    for _ in range(due):
                        record = self.generator.record(now_ms)
                        while True:
                            try:
                                producer.produce(
                                    record.topic, value=record.value, key=record.key, partition=record.partition,
                                    timestamp=record.timestamp_ms, headers=record.headers(intent),
                                )
                                break
                            except BufferError:
                                producer.poll(0.1)
                        count += 1
                    producer.poll(0)
                    time.sleep(min(limiter.wait_seconds(), 0.05) if due == 0 else 0)
                if abort:
                    self._finish(producer.abort_transaction)
                    self.stats["aborted_on_purpose"] += count
                    self.stats["transactions_aborted_on_purpose"] += 1
                else:
                    self._finish(producer.commit_transaction)
                    self.stats["committed"] += count
                    self.stats["transactions_committed"] += 1
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                self._note(f"transaction of {count} records failed: {exc}")
                self.stats["lost_to_faults"] += count
                self.stats["transactions_failed"] += 1
                fatal = bool(error is not None and hasattr(error, "fatal") and error.fatal())
                if not fatal:
                    try:
                        self._finish(producer.abort_transaction)
                    except KafkaException as again:
                        self._note(f"abort after a failure: {again}")
                        fatal = True
                if fatal:
                    self.stats["producer_restarts"] += 1
                    producer = self._producer()  # a new instance with the same id fences the old one
        # The last transaction is finished above; nothing is left in the queue.
        producer.flush(30)

    def _finish(self, action) -> None:
        """commit/abort, retried while the error is retriable (a broker restarting), for up to 3 minutes."""
        from confluent_kafka import KafkaException

        deadline = _now() + 180
        while True:
            try:
                action(30)
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if error is not None and hasattr(error, "retriable") and error.retriable() and _now() < deadline:
                    self._note(f"{action.__name__} retried: {exc}")
                    time.sleep(1)
                    continue
                raise
