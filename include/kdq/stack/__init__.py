"""The embedded local deployment: a KRaft Kafka broker and InfluxDB 1.x on loopback, Spark in local mode."""
