"""Demo traffic: realistic valid, invalid, out-of-order and late JSON records for the local run.

``kdq demo`` (and ``make run``, in the background) produces records at a fixed rate to a few topics.
Each topic has a **record kind** that knows how a good document looks and how it goes bad
(:mod:`kdq.traffic.kinds`):

* ``orders`` and ``payments`` follow ``config/rules/orders.schema.json`` / ``payments.schema.json``;
  their invalid records break one rule each (a missing field, a negative amount, an unknown currency,
  an extra field, ...), so the invalid-reason breakdown shows several ``schema:<pointer>`` reasons;
* ``json``, for topics without a rule: any JSON object is valid;
* ``measurements`` (topic ``ops.metrics``): numeric server measurements for the streaming summary
  ``ops_metrics`` configured in ``kdq.toml`` (:class:`~kdq.traffic.kinds.MeasurementsKind`);
* every kind also produces undecodable values (``not_json``, ``not_utf8``) among its invalid records;
* ``avro_orders`` (topic ``orders.avro``) and ``protobuf_payments`` (topic ``payments.proto``) are written through
  the Schema Registry in Confluent's wire format (:class:`~kdq.traffic.kinds.RegistryKind`: the schema registered
  under ``<topic>-value`` at start); their invalid records are the registry's kinds of bad (no magic byte, an unknown
  schema id, a truncated payload, trailing bytes, a bad enum index, a wrong wire type, a bad message index). They
  join the default topics when a registry is configured or the local stack runs one
  (:func:`~kdq.traffic.kinds.default_topics`).

Timing, per record: *on time* (event time = now), *out of order* (event time up to 80 % of the allowed
lateness in the past: the speed layer still counts it and updates that older window), or *late* (event
time more than the allowed lateness, plus up to 10 minutes, in the past: the speed layer archives it
uncounted and the hourly batch layer corrects its window). The event time is the Kafka record
timestamp (the demo topics' rules configure no event-time field); ``created_at`` in the value carries
the same time for people reading the records.

Generation is pure and deterministic for a seed (:class:`kdq.traffic.generator.TrafficGenerator`, tested in
``tests/unit/test_traffic.py``); :func:`kdq.traffic.producer.run_demo` adds the producer and the rate limiter, and
:mod:`kdq.traffic.process` runs it as the local run's background process. A new record kind is a
:class:`~kdq.traffic.kinds.RecordKind` subclass registered in :data:`kdq.traffic.kinds.KINDS`.
"""
