"""The real KRaft broker: a 3-partition topic, keyed records with explicit timestamps, read back."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kdq.stack.manager import LocalStack


def test_produce_to_every_partition_and_consume_back(local_stack: LocalStack, topic_name: str) -> None:
    local_stack.kafka.create_topic(topic_name, partitions=3)
    bootstrap = local_stack.kafka.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = []
    for i in range(30):
        partition = i % 3
        timestamp = 1_700_000_000_000 + i * 100
        producer.produce(topic_name, key=f"k{i}", value=f'{{"n":{i}}}', partition=partition, timestamp=timestamp)
        sent.append((partition, f"k{i}", f'{{"n":{i}}}', timestamp))
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, p, 0) for p in range(3)])
    received = []
    deadline = time.monotonic() + 30
    try:
        while len(received) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            received.append((msg.partition(), msg.key().decode(), msg.value().decode(), msg.timestamp()[1]))
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)
    assert {p for p, *_ in received} == {0, 1, 2}


def test_the_stack_resolves_the_addresses_it_recorded(local_stack: LocalStack, stack_config) -> None:
    """A Config reads the local stack's addresses (state.json) when it is built: the stack reads them again
    after recording them; a config loaded before that sees them once loaded again."""
    from kdq.config import ConfigError
    from tests.conftest import make_config

    assert local_stack.config.kafka_bootstrap() == local_stack.kafka.bootstrap
    assert local_stack.config.influx_url() == local_stack.influx.url
    assert local_stack.config.spark_master() == stack_config.spark.master  # the single-broker shape
    with pytest.raises(ConfigError, match="no local broker is recorded"):
        stack_config.kafka_bootstrap()  # loaded before the stack recorded its ports
    assert stack_config.reload_stack_addresses().kafka_bootstrap() == local_stack.kafka.bootstrap
    assert make_config(stack_config.data_dir).influx_url() == local_stack.influx.url
