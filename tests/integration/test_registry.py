"""The local stack's Schema Registry: the real Apicurio Registry, started by kdq.stack.registry, through
Confluent's Python client on its Confluent-compatible API. Avro and Protobuf schemas registered under
``<topic>-value`` subjects (the topic-name strategy) keep their ids across a stop and start and across a SIGKILL
(the storage is an H2 file under the data folder), and a stopped registry leaves no process or port behind."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from kdq.procs import port_open
from kdq.stack.registry import LocalRegistry

pytestmark = pytest.mark.integration

# Nested record, enum, union with null, logical types: the shapes the decoders will meet.
AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "io.kdq.test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None},
        ]}},
    ],
}
PROTOBUF_PAYMENT = """\
syntax = "proto3";
package io.kdq.test;

message Payment {
  string id = 1;
  int64 amount_cents = 2;
  Method method = 3;
  Card card = 4;
  enum Method {
    METHOD_UNSPECIFIED = 0;
    CARD = 1;
    TRANSFER = 2;
  }
  message Card {
    string last4 = 1;
  }
}
"""


def _client(registry: LocalRegistry) -> SchemaRegistryClient:
    # A new client per phase: Confluent's client caches schemas by id, and the point is what the registry answers.
    return SchemaRegistryClient({"url": registry.url, "timeout": 10})


def _stopped_cleanly(registry: LocalRegistry, pid: int) -> None:
    assert not registry.process.running()
    assert not (psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE), f"pid {pid} left"
    assert not port_open(registry.port), f"port {registry.port} still open"


def test_avro_and_protobuf_schemas_keep_their_ids_across_restarts(schema_registry: LocalRegistry, topic_name: str) -> None:
    registry = schema_registry
    orders, payments = f"{topic_name}-orders-value", f"{topic_name}-payments-value"
    client = _client(registry)
    avro = Schema(json.dumps(AVRO_ORDER), "AVRO")
    protobuf = Schema(PROTOBUF_PAYMENT, "PROTOBUF")
    avro_id = client.register_schema(orders, avro)
    protobuf_id = client.register_schema(payments, protobuf)
    assert avro_id != protobuf_id
    assert client.register_schema(orders, avro) == avro_id  # registering the same schema again: the same id

    def check(client: SchemaRegistryClient) -> None:
        stored_avro = client.get_schema(avro_id)
        assert stored_avro.schema_type in (None, "AVRO")  # Confluent's API leaves out AVRO, its default
        assert json.loads(stored_avro.schema_str) == AVRO_ORDER
        stored_protobuf = client.get_schema(protobuf_id)
        assert stored_protobuf.schema_type == "PROTOBUF"
        assert "message Payment" in stored_protobuf.schema_str and "enum Method" in stored_protobuf.schema_str
        assert client.get_latest_version(orders).schema_id == avro_id
        assert client.get_latest_version(payments).schema_id == protobuf_id
        assert client.get_versions(orders) == [1] and client.get_versions(payments) == [1]
        assert {orders, payments} <= set(client.get_subjects())

    check(client)

    # A clean stop: nothing left, and a start finds every schema under its id (storage on disk).
    pid = registry.process.process().pid
    assert registry.stop()
    _stopped_cleanly(registry, pid)
    registry.start(timeout=180)
    check(_client(registry))

    # Killed right after a registration: the schema is there after the restart (H2 writes each commit at once).
    late = f"{topic_name}-late-value"
    late_id = _client(registry).register_schema(late, Schema(json.dumps({**AVRO_ORDER, "name": "LateOrder"}), "AVRO"))
    pid = registry.process.process().pid
    os.killpg(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=30)
    registry.stop()  # forgets the dead process's pid file
    _stopped_cleanly(registry, pid)
    registry.start(timeout=180)
    after_kill = _client(registry)
    check(after_kill)
    assert after_kill.get_latest_version(late).schema_id == late_id
    assert json.loads(after_kill.get_schema(late_id).schema_str)["name"] == "LateOrder"


def test_a_registered_schema_version_changes_the_rules_version_of_its_topic(schema_registry: LocalRegistry,
                                                                           topic_name: str, tmp_path) -> None:
    """kdq.registry_versions.current_rules asks the registry for each exact registry-backed topic's subject
    versions: registering a new version is a rule change for that topic (its windows' rules_version goes stale,
    a rebuild re-judges them), the same version again is not; without a registry the settings alone count."""
    from kdq.registry_versions import current_rules
    from tests.conftest import make_config

    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "topics.toml").write_text(f'[[topic]]\nmatch = "{topic_name}"\nregistry = true\n')
    config = make_config(tmp_path / "data", paths={"rules_dir": str(tmp_path / "rules")},
                         registry={"url": schema_registry.url})
    settings_only = current_rules(make_config(tmp_path / "data", paths={"rules_dir": str(tmp_path / "rules")}))
    before = current_rules(config).version_for(topic_name)  # no subject yet: no versions
    assert before != settings_only.version_for(topic_name)
    client = _client(schema_registry)
    client.register_schema(f"{topic_name}-value", Schema(json.dumps(AVRO_ORDER), "AVRO"))
    first = current_rules(config).version_for(topic_name)
    client.register_schema(f"{topic_name}-value", Schema(json.dumps(AVRO_ORDER), "AVRO"))  # the same: no new version
    assert current_rules(config).version_for(topic_name) == first != before
    evolved = {**AVRO_ORDER, "fields": [*AVRO_ORDER["fields"], {"name": "note", "type": ["null", "string"],
                                                                "default": None}]}
    client.register_schema(f"{topic_name}-value", Schema(json.dumps(evolved), "AVRO"))
    assert current_rules(config).version_for(topic_name) not in (before, first)
