"""Registry-backed topics end to end: Avro messages written with Confluent's serializer through the real
Apicurio Registry, judged by the speed layer's JVM classifier against the schema each message's header names.
Exact counts and reasons in Delta, on the metrics topic and in InfluxDB for valid messages and each invalid kind;
a schema version registered while the stream runs is used without a restart; a registry stopped for a minute,
while messages with a schema id the stream never saw arrive, fails the micro-batch (a retry, never a verdict) and,
once it is back, every message is counted exactly once."""

from __future__ import annotations

import copy
import io
import json
import struct
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kdq.rules import load_rules
from kdq.spark.session import registry_conf
from kdq.spark.speed_layer import SpeedLayer
from kdq.stack.registry import LocalRegistry
from tests.conftest import PROJECT_ROOT
from tests.integration.helpers import (
    W0,
    archived_offsets,
    expected_counts,
    expected_reasons,
    influx_points,
    isolated_config,
    latest_metrics,
    produce,
    reason_counts,
    window_counts,
)
from tests.integration.test_registry import AVRO_ORDER
from tests.integration.test_speed_layer_example import run_available_now

pytestmark = pytest.mark.integration

# Version 2 of the orders schema: a field added with a default (backward compatible, as a team would evolve it).
AVRO_ORDER_V2 = {**AVRO_ORDER, "fields": [*AVRO_ORDER["fields"], {"name": "channel", "type": ["null", "string"],
                                                                 "default": None}]}
OTHER = {"type": "record", "name": "Other", "namespace": "io.kdq.test", "fields": [{"name": "x", "type": "long"}]}


@pytest.fixture
def registry_jvm(spark) -> Iterator[Callable]:
    """Gives the shared test session's JVM the registry settings a kdq job gets at start (kdq.spark.session
    .registry_conf in its Spark configuration): that session started before the registry did. Local mode: the
    driver's SparkEnv is the executors' too."""
    conf = spark.sparkContext._jvm.org.apache.spark.SparkEnv.get().conf()
    keys: list[str] = []

    def configure(config) -> None:
        for key, value in registry_conf(config).items():
            conf.set(key, value)
            keys.append(key)

    yield configure
    for key in keys:
        conf.remove(key)


def _rules(folder, topic: str) -> None:
    folder.mkdir(parents=True)
    (folder / "topics.toml").write_text(
        f'[[topic]]\nmatch = "{topic}"\nregistry = true\nevent_time_field = "created"\n'
    )


def _order(i: int, created_ms: int) -> dict:
    return {
        "id": f"o-{i}",
        "amount": Decimal("12.34"),
        "created": datetime.fromtimestamp(created_ms / 1000, UTC),
        "status": "PAID",
        "customer": {"name": "Ada", "email": None if i % 2 else "ada@example.com"},
    }


def _frame(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def _avro(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(copy.deepcopy(schema)), record)
    return out.getvalue()


def _serializer(client: SchemaRegistryClient, schema: dict) -> AvroSerializer:
    return AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})


def test_avro_topic_counts_every_kind_exactly(spark, local_stack, schema_registry: LocalRegistry, registry_jvm,
                                              tmp_path) -> None:
    prefix = f"rg{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    _rules(tmp_path / "rules", topic)
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")},
                             registry={"url": schema_registry.url})
    registry_jvm(config)
    local_stack.kafka.create_topic(topic, partitions=2)
    client = SchemaRegistryClient(config.registry_client_conf())
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = _serializer(client, AVRO_ORDER)

    ts = W0 + 100
    valid = [v1(_order(i, ts), context) for i in range(6)]
    orders_id = struct.unpack(">I", valid[0][1:5])[0]
    other_id = client.register_schema(f"{prefix}-other-value", Schema(json.dumps(OTHER), "AVRO"))
    # The status enum written as its 8th symbol (a writer with a wider enum): no symbol of the registered schema.
    wide = copy.deepcopy(AVRO_ORDER)
    wide["fields"][3]["type"]["symbols"] = [*wide["fields"][3]["type"]["symbols"], "A", "B", "C", "D", "E"]
    bad_enum = _frame(orders_id, _avro(wide, {**_order(9, ts), "status": "E"}))
    cases: list[tuple[bytes | None, str | None]] = [
        *((v, None) for v in valid),
        (b'{"id": "o-1"}', "no_magic_byte"),
        (b"", "no_magic_byte"),
        (None, "null_value"),
        (_frame(999_999, valid[0][5:]), "unknown_schema_id"),
        (_frame(other_id, _avro(OTHER, {"x": 1})), "schema_not_for_subject"),
        (valid[0][:7], "avro:/id"),  # cut inside the first field (its length, then 1 of its 3 characters)
        (valid[0] + b"\x00", "avro:$trailing_bytes"),
        (bad_enum, "avro:/status"),
        (v1({**_order(7, ts), "created": -5}, context), "bad_timestamp"),  # before 1970: no event time
    ]
    produce(config.kafka_bootstrap(), topic, [(i % 2, value, ts) for i, (value, _) in enumerate(cases)])
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)

    expected = expected_counts(topic, [(ts, reason is None) for _, reason in cases])
    assert window_counts(spark, config, topic) == expected
    got_reasons = reason_counts(spark, config, topic)
    assert got_reasons == expected_reasons([(ts, reason) for _, reason in cases if reason is not None]), got_reasons

    # A new version of the subject's schema, registered while the stream runs, is used without a restart.
    v2 = _serializer(client, AVRO_ORDER_V2)
    ts2 = W0 + 1_100
    newer = [v2({**_order(20 + i, ts2), "channel": "web"}, context) for i in range(4)]
    assert struct.unpack(">I", newer[0][1:5])[0] != orders_id
    produce(config.kafka_bootstrap(), topic, [(i % 2, value, ts2) for i, value in enumerate(newer)])
    run_available_now(layer)

    expected = expected_counts(topic, [(ts, reason is None) for _, reason in cases] + [(ts2, True)] * len(newer))
    assert window_counts(spark, config, topic) == expected
    metrics = latest_metrics(config)
    assert {k: v for k, v in metrics.items() if k[0] == topic} == expected
    n_valid, n_invalid = sum(r is None for _, r in cases), sum(r is not None for _, r in cases)
    assert influx_points(config, topic) == {W0: (n_valid, n_invalid), W0 + 1_000: (len(newer), 0)}


def test_a_registry_outage_loses_and_doubles_nothing(spark, local_stack, schema_registry: LocalRegistry, registry_jvm,
                                                     tmp_path) -> None:
    prefix = f"ro{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    _rules(tmp_path / "rules", topic)
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")},
                             registry={"url": schema_registry.url, "timeout_seconds": 2})
    registry_jvm(config)
    local_stack.kafka.create_topic(topic, partitions=2)
    client = SchemaRegistryClient(config.registry_client_conf())
    context = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = _serializer(client, AVRO_ORDER), _serializer(client, AVRO_ORDER_V2)
    ts = W0 + 200

    first = [v1(_order(i, ts), context) for i in range(5)]
    produce(config.kafka_bootstrap(), topic, [(i % 2, v, ts) for i, v in enumerate(first)])
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 5}

    # Version 2 registered, never met by the stream; then the registry goes away for a minute while messages of
    # both versions arrive.
    unseen = [v2({**_order(10 + i, ts), "channel": "app"}, context) for i in range(3)]
    seen = [v1(_order(20 + i, ts), context) for i in range(4)]
    stopped_at = time.monotonic()
    assert schema_registry.stop()
    try:
        produce(config.kafka_bootstrap(), topic, [(i % 2, v, ts) for i, v in enumerate(seen + unseen)])
        query = layer.start(available_now=True)
        try:
            with pytest.raises(Exception) as failure:  # noqa: PT011 (pyspark's StreamingQueryException)
                query.awaitTermination(180)
        finally:
            query.stop()
        # Not a verdict on what the registry could not say: the micro-batch failed, nothing of it was written.
        assert "RegistryUnavailableException" in str(failure.value), failure.value
        assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 5}
        time.sleep(max(0.0, 60 - (time.monotonic() - stopped_at)))
    finally:
        if not schema_registry.process.running():
            schema_registry.start(timeout=180)

    run_available_now(layer)
    assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 12}
    assert set(archived_offsets(spark, config, topic).values()) == {1}
    assert sum(archived_offsets(spark, config, topic).values()) == 12
    assert latest_metrics(config)[(topic, W0, "valid")] == 12
    assert influx_points(config, topic) == {W0: (12, 0)}


def _protobuf_payment_class():
    """A Payment message class made at run time (no protoc here): payment.proto imports common.proto (a Protobuf
    reference, which Confluent's serializer registers as a subject of its own) and has a nested message, an enum,
    a repeated field and the event time as epoch millis."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    common = descriptor_pb2.FileDescriptorProto(name="io/kdq/test/common.proto", package="io.kdq.test",
                                                syntax="proto3")
    money = common.message_type.add(name="Money")
    money.field.add(name="currency", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    money.field.add(name="units", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    payment = descriptor_pb2.FileDescriptorProto(name="io/kdq/test/payment.proto", package="io.kdq.test",
                                                 syntax="proto3", dependency=["io/kdq/test/common.proto"])
    message = payment.message_type.add(name="Payment")
    message.field.add(name="id", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    message.field.add(name="amount", number=2, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                      type_name=".io.kdq.test.Money")
    message.field.add(name="method", number=3, type=field.TYPE_ENUM, label=field.LABEL_OPTIONAL,
                      type_name=".io.kdq.test.Payment.Method")
    message.field.add(name="tags", number=4, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    message.field.add(name="created_ms", number=5, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    message.field.add(name="card", number=6, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                      type_name=".io.kdq.test.Payment.Card")
    method = message.enum_type.add(name="Method")
    for number, name in enumerate(("METHOD_UNSPECIFIED", "CARD", "TRANSFER")):
        method.value.add(name=name, number=number)
    message.nested_type.add(name="Card").field.add(name="last4", number=1, type=field.TYPE_STRING,
                                                   label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(common)
    pool.Add(payment)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("io.kdq.test.Payment"))


def test_protobuf_topic_counts_every_kind_exactly(spark, local_stack, schema_registry: LocalRegistry, registry_jvm,
                                                  tmp_path) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    prefix = f"rp{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-payments"
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "topics.toml").write_text(
        f'[[topic]]\nmatch = "{topic}"\nregistry = true\nevent_time_field = "created_ms"\n'
        'event_time_format = "epoch_millis"\n'
    )
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(folder)},
                             registry={"url": schema_registry.url})
    registry_jvm(config)
    local_stack.kafka.create_topic(topic, partitions=2)
    client = SchemaRegistryClient(config.registry_client_conf())
    payment = _protobuf_payment_class()
    serialize = ProtobufSerializer(payment, client, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    ts = W0 + 300

    def message(i: int, **fields) -> bytes:
        p = payment(id=f"p-{i}", created_ms=ts, tags=["a", "b"], **fields)
        p.amount.currency, p.amount.units = "EUR", 100 + i
        p.card.last4 = "4242"
        return serialize(p, context)

    valid = [message(i, method=1 + i % 2) for i in range(5)]
    payments_id = struct.unpack(">I", valid[0][1:5])[0]
    assert client.get_schema(payments_id).references, "the import went to the registry as a reference"
    header = valid[0][:6]  # magic, id, message indexes [0]
    cases: list[tuple[bytes | None, str | None]] = [
        *((v, None) for v in valid),
        (message(9, method=7), None),  # proto3 enums are open: an unknown number is a value, not an error
        (b'{"id": "p-1"}', "no_magic_byte"),
        (_frame(999_998, valid[0][5:]), "unknown_schema_id"),
        (header + b"\x0a\x05ab", "protobuf:/id"),  # field 1 claims 5 bytes, 2 follow
        (header + b"\x08\x01", "protobuf:/id"),  # field 1 (a string) written as a varint
        (_frame(payments_id, b"\x02\x0a" + valid[0][6:]), "protobuf:$message_index"),  # message [5]: none
        (header + payment(id="p-8", created_ms=-1).SerializeToString(), "bad_timestamp"),  # before 1970
    ]
    produce(config.kafka_bootstrap(), topic, [(i % 2, value, ts) for i, (value, _) in enumerate(cases)])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))

    expected = expected_counts(topic, [(ts, reason is None) for _, reason in cases])
    assert window_counts(spark, config, topic) == expected
    got_reasons = reason_counts(spark, config, topic)
    assert got_reasons == expected_reasons([(ts, reason) for _, reason in cases if reason is not None]), got_reasons
    assert {k: v for k, v in latest_metrics(config).items() if k[0] == topic} == expected
    n_valid, n_invalid = sum(r is None for _, r in cases), sum(r is not None for _, r in cases)
    assert influx_points(config, topic) == {W0: (n_valid, n_invalid)}


def test_the_demos_avro_and_protobuf_topics_are_counted_as_produced(spark, local_stack, schema_registry: LocalRegistry,
                                                                    registry_jvm, tmp_path) -> None:
    """`make run`'s registry-backed demo topics (kdq.traffic's avro_orders and protobuf_payments, their schemas
    registered at the demo's start) under the shipped rules' settings: every record the demo calls valid is
    valid for the stream, every one it calls invalid is invalid."""
    import shutil

    from kdq.traffic.generator import TrafficSpec
    from kdq.traffic.producer import run_demo

    prefix = f"rd{tmp_path.name[-6:].replace('_', '')}"
    avro_topic, protobuf_topic = f"{prefix}-orders.avro", f"{prefix}-payments.proto"
    folder = tmp_path / "rules"
    shutil.copytree(PROJECT_ROOT / "config" / "rules", folder)
    shipped = (folder / "topics.toml").read_text()
    assert 'match = "orders.avro"' in shipped and 'match = "payments.proto"' in shipped
    (folder / "topics.toml").write_text(
        shipped.replace('"orders.avro"', f'"{avro_topic}"').replace('"payments.proto"', f'"{protobuf_topic}"')
    )
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(folder)},
                             registry={"url": schema_registry.url})
    registry_jvm(config)
    spec = TrafficSpec(topics=((avro_topic, "avro_orders"), (protobuf_topic, "protobuf_payments")), rate=2000,
                       count=600, invalid_ratio=0.3, out_of_order=0, late=0, seed=28, partitions=2)
    stats = run_demo(config, spec)
    assert stats["delivered"] == 600 and stats["failed"] == 0, stats
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))

    for topic in (avro_topic, protobuf_topic):
        counted: dict[str, int] = {"valid": 0, "invalid": 0}
        for (_, _, status), n in window_counts(spark, config, topic).items():
            counted[status] += n
        produced = stats["topics"][topic]
        assert counted == {"valid": produced.get("valid", 0), "invalid": produced.get("invalid", 0)}, (topic, produced)
        assert produced.get("invalid", 0) > 20  # every kind of defect, about 30 % of the topic
        reasons = {reason for (_, reason) in reason_counts(spark, config, topic)}
        assert {"no_magic_byte", "unknown_schema_id"} <= reasons and "internal_error" not in " ".join(reasons), reasons


def test_streaming_summaries_read_the_decoded_avro_records(spark, local_stack, schema_registry: LocalRegistry,
                                                           registry_jvm, tmp_path) -> None:
    """A streaming summary on a registry-backed topic takes its value (a double) and its group (an enum) from the
    record the registry's schema decodes: counts, min and max per group as produced."""
    from kdq.traffic.kinds import AvroOrdersKind, frame
    from tests.integration.helpers import summary_rows

    prefix = f"rs{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "topics.toml").write_text(f'[[topic]]\nmatch = "{topic}"\nregistry = true\n')
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")},
                             registry={"url": schema_registry.url}).with_summaries(
        [{"name": "amount", "topic": topic, "value": "amount", "group_by": ["currency"], "window_seconds": 600,
          "allowed_lateness_seconds": 600, "significant_digits": 3, "percentiles": [50]}]
    )
    registry_jvm(config)
    local_stack.kafka.create_topic(topic, partitions=2)
    kind = AvroOrdersKind()
    schema_id = SchemaRegistryClient(config.registry_client_conf()).register_schema(
        f"{topic}-value", Schema(kind.schema_text, "AVRO"))
    ts = W0 + 400
    amounts: dict[str, list[float]] = {"EUR": [], "USD": []}
    records = []
    for i in range(40):
        currency = "EUR" if i % 3 else "USD"
        amount = round(1.5 + i * 2.25, 2)
        amounts[currency].append(amount)
        document = {"order_id": f"o-{i}", "amount": amount, "currency": currency,
                    "customer": {"id": "c-1", "email": None}, "lines": [{"sku": "s", "qty": 1}], "created_at": ts}
        records.append((i % 2, frame(schema_id, kind.payload(document)), ts))
    produce(config.kafka_bootstrap(), topic, records)
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))

    window = ts // 600_000 * 600_000
    rows = summary_rows(spark, config, "amount")
    for currency, values in amounts.items():
        row = rows[("amount", topic, window, json.dumps({"currency": currency}, separators=(",", ":")))]
        assert (row["count"], row["min"], row["max"]) == (len(values), min(values), max(values)), row
    assert len(rows) == 2


def test_json_schema_topic_counts_every_kind_exactly(spark, local_stack, schema_registry: LocalRegistry,
                                                     registry_jvm, tmp_path) -> None:
    """A topic written with Confluent's JSONSerializer (schemaType JSON in Apicurio): json:<pointer> reasons from
    the registered schema, not_json for a payload that is not JSON, the event time from the decoded document."""
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    prefix = f"rj{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-shipments"
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "topics.toml").write_text(
        f'[[topic]]\nmatch = "{topic}"\nregistry = true\nevent_time_field = "sent_ms"\n'
    )
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")},
                             registry={"url": schema_registry.url})
    registry_jvm(config)
    local_stack.kafka.create_topic(topic, partitions=2)
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Shipment", "type": "object",
              "properties": {"id": {"type": "string", "minLength": 2}, "weight": {"type": "number", "minimum": 0},
                             "sent_ms": {"type": "integer"}},
              "required": ["id", "weight", "sent_ms"]}
    client = SchemaRegistryClient(config.registry_client_conf())
    serialize = JSONSerializer(json.dumps(schema), client)
    context = SerializationContext(topic, MessageField.VALUE)
    ts = W0 + 500
    valid = [serialize({"id": f"s-{i}", "weight": 1.5 * i, "sent_ms": ts}, context) for i in range(5)]
    header = valid[0][:5]
    cases: list[tuple[bytes | None, str | None]] = [
        *((v, None) for v in valid),
        (header + b'{"id": "s-9", "weight": -1, "sent_ms": %d}' % ts, "json:/properties/weight/minimum"),
        (header + b'{"id": "s", "weight": 1, "sent_ms": %d}' % ts, "json:/properties/id/minLength"),
        (header + b'{"weight": 1, "sent_ms": %d}' % ts, "json:/required/0"),  # the first required name
        (header + b'{"id": "s-9", "weight": ', "not_json"),
        (b'{"id": "s-9", "weight": 1}', "no_magic_byte"),
    ]
    produce(config.kafka_bootstrap(), topic, [(i % 2, value, ts) for i, (value, _) in enumerate(cases)])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))

    assert window_counts(spark, config, topic) == expected_counts(topic, [(ts, r is None) for _, r in cases])
    got = reason_counts(spark, config, topic)
    assert got == expected_reasons([(ts, r) for _, r in cases if r is not None]), got


def test_record_name_strategies_judge_each_record_type_by_its_own_subject(spark, local_stack,
                                                                          schema_registry: LocalRegistry,
                                                                          registry_jvm, tmp_path) -> None:
    """Topics whose producers use Confluent's record-name subject strategies (several record types per topic):
    ``topic_record_name`` (subjects ``<topic>-<record>``) and ``record_name`` (subjects named by the record,
    shared by every topic), written with the Python serializers' own strategies. Each record type is judged
    against its own subject; a record type registered for another topic is ``schema_not_for_subject``; and the
    topic-record-name rule's version follows its subjects' versions (kdq.registry_versions.current_rules)."""
    from confluent_kafka.schema_registry import record_subject_name_strategy, topic_record_subject_name_strategy

    from kdq.registry_versions import current_rules

    prefix = f"rn{tmp_path.name[-6:].replace('_', '')}"
    mixed, shared = f"{prefix}-mixed", f"{prefix}-shared"
    namespace = f"io.kdq.{prefix}"  # record-name subjects are global in a registry: this test's own names
    order = {**AVRO_ORDER, "namespace": namespace}
    refund = {"type": "record", "name": "Refund", "namespace": namespace,
              "fields": [{"name": "order_id", "type": "string"}, {"name": "created", "type": "long"}]}
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "topics.toml").write_text(
        f'[[topic]]\nmatch = "{mixed}"\nregistry = true\nsubject_strategy = "topic_record_name"\n'
        'event_time_field = "created"\n'
        f'[[topic]]\nmatch = "{shared}"\nregistry = true\nsubject_strategy = "record_name"\n'
        'event_time_field = "created"\n'
    )
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")},
                             registry={"url": schema_registry.url})
    registry_jvm(config)
    for topic in (mixed, shared):
        local_stack.kafka.create_topic(topic, partitions=2)
    client = SchemaRegistryClient(config.registry_client_conf())
    version_before = current_rules(config).version_for(mixed)

    def serializer(schema: dict, strategy) -> AvroSerializer:
        return AvroSerializer(client, json.dumps(schema),
                              conf={"auto.register.schemas": True, "subject.name.strategy": strategy})

    ts = W0 + 700
    in_mixed = SerializationContext(mixed, MessageField.VALUE)
    in_shared = SerializationContext(shared, MessageField.VALUE)
    orders = serializer(order, topic_record_subject_name_strategy)
    refunds = serializer(refund, topic_record_subject_name_strategy)
    mixed_cases: list[tuple[bytes | None, str | None]] = [
        *((orders(_order(i, ts), in_mixed), None) for i in range(3)),
        *((refunds({"order_id": f"o-{i}", "created": ts}, in_mixed), None) for i in range(2)),
    ]
    # A Refund written for the shared topic (subject <namespace>.Refund only): not a subject of the mixed topic.
    shared_refunds = serializer(refund, record_subject_name_strategy)
    foreign = shared_refunds({"order_id": "o-9", "created": ts}, in_shared)
    assert client.get_versions(f"{namespace}.Refund") and client.get_versions(f"{mixed}-{namespace}.Refund")
    other_id = client.register_schema(f"{prefix}-elsewhere-{namespace}.Other",
                                      Schema(json.dumps({**OTHER, "namespace": namespace}), "AVRO"))
    mixed_cases += [
        (_frame(other_id, _avro(OTHER, {"x": 1})), "schema_not_for_subject"),
        (mixed_cases[0][0] + b"\x00", "avro:$trailing_bytes"),
    ]
    # In the shared topic: Refunds by their record subject are valid; an Order has no <namespace>.Order subject.
    shared_cases: list[tuple[bytes | None, str | None]] = [
        (foreign, None),
        (shared_refunds({"order_id": "o-8", "created": ts}, in_shared), None),
        (mixed_cases[0][0], "schema_not_for_subject"),
    ]
    produce(config.kafka_bootstrap(), mixed, [(i % 2, v, ts) for i, (v, _) in enumerate(mixed_cases)])
    produce(config.kafka_bootstrap(), shared, [(i % 2, v, ts) for i, (v, _) in enumerate(shared_cases)])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))

    for topic, cases in ((mixed, mixed_cases), (shared, shared_cases)):
        assert window_counts(spark, config, topic) == expected_counts(topic, [(ts, r is None) for _, r in cases])
        got = reason_counts(spark, config, topic)
        assert got == expected_reasons([(ts, r) for _, r in cases if r is not None]), (topic, got)
    # Two record subjects of the mixed topic now have versions: its rule's version moved; the shared topic's
    # (record_name: subjects shared by every topic) is its settings' alone.
    after = current_rules(config)
    assert after.version_for(mixed) != version_before
    assert after.version_for(shared) == load_rules(config.rules_dir).version_for(shared)


def test_a_schema_registered_for_the_topic_is_a_rule_change_a_rebuild_applies(spark, local_stack,
                                                                             schema_registry: LocalRegistry,
                                                                             registry_jvm, tmp_path) -> None:
    """Rebuild after a schema change works as after a rule change: records whose schema was registered for
    another topic only are ``schema_not_for_subject``; once the team registers that schema under the topic's
    subject, the topic's rule version moves (kdq.registry_versions.current_rules, as the rebuild job loads it), and
    one rebuild of the range re-judges the archived records: the windows get the new truth and the new
    rules_version, with rule_change corrections."""
    from spark_jobs import rebuild as rebuild_job

    from kdq.registry_versions import current_rules
    from tests.integration.test_rebuild import _args, _versions

    prefix = f"rr{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    _rules(tmp_path / "rules", topic)
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")},
                             registry={"url": schema_registry.url})
    registry_jvm(config)
    local_stack.kafka.create_topic(topic, partitions=2)
    client = SchemaRegistryClient(config.registry_client_conf())
    context = SerializationContext(topic, MessageField.VALUE)
    valid = [_serializer(client, AVRO_ORDER)(_order(i, W0 + 200), context) for i in range(3)]
    # The next version of the orders schema, registered so far for another topic only.
    elsewhere = client.register_schema(f"{prefix}-elsewhere-value", Schema(json.dumps(AVRO_ORDER_V2), "AVRO"))
    newer = [_frame(elsewhere, _avro(AVRO_ORDER_V2, {**_order(10 + i, W0 + 1_200), "channel": "app"}))
             for i in range(2)]
    sent = [(v, W0 + 200) for v in valid] + [(v, W0 + 1_200) for v in newer]
    produce(config.kafka_bootstrap(), topic, [(i % 2, v, ts) for i, (v, ts) in enumerate(sent)])
    before_rules = current_rules(config)
    run_available_now(SpeedLayer(spark, config, before_rules))
    assert window_counts(spark, config, topic) == expected_counts(
        topic, [(W0 + 200, True)] * 3 + [(W0 + 1_200, False)] * 2)
    assert reason_counts(spark, config, topic) == expected_reasons([(W0 + 1_200, "schema_not_for_subject")] * 2)

    registered = client.register_schema(f"{topic}-value", Schema(json.dumps(AVRO_ORDER_V2), "AVRO"))
    assert registered == elsewhere, "the registry gives the same schema the same id in every subject"
    after_rules = current_rules(config)
    assert after_rules.version_for(topic) != before_rules.version_for(topic)

    # The rebuild is a job of its own (spark-submit: a JVM of its own). Here it shares the stream's JVM, whose
    # registry cache keeps "not a version of the subject" for a minute: the same registry under another address
    # is a cache of its own, as a new JVM's is.
    rebuild_config = config.model_copy(update={"registry": config.registry.model_copy(
        update={"url": schema_registry.url.replace("127.0.0.1", "localhost")})})
    registry_jvm(rebuild_config)
    report = rebuild_job.run(spark, rebuild_config, _args(W0, W0 + 10_000, [topic], f"{prefix}-rb"))
    assert report["ok"], report
    truth = expected_counts(topic, [(ts, True) for _, ts in sent])
    assert window_counts(spark, config, topic) == truth
    assert _versions(spark, config, topic) == {after_rules.version_for(topic)}
    assert reason_counts(spark, config, topic) == {}
    corrections = {(r["status"], r["old_count"], r["new_count"], r["reason"]) for r in spark.read.format("delta")
                   .load(str(config.tables_dir / "corrections")).where(f"topic = '{topic}'").collect()}
    assert corrections == {("valid", 0, 2, "rule_change"), ("invalid", 2, 0, "rule_change")}
    assert latest_metrics(config)[(topic, W0 + 1_000, "valid")] == 2
