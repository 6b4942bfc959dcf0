package io.kdq.spark.registry;

/**
 * A record that decoded, read by path: what {@code event_time_field} and the streaming summaries'
 * {@code value}/{@code group_by} paths will walk, as they walk JSON members today.
 */
public interface DecodedRecord {
    /**
     * The value at {@code path} (record field names, map keys, array indexes as decimal text), through unions;
     * null when a step is absent or the value is null. Values come as plain Java: strings and enum symbols as
     * String, Avro {@code bytes}/{@code fixed} as byte[], {@code int}/{@code long}/{@code float}/{@code double}/
     * {@code boolean} boxed; logical types as their meaning: {@code timestamp-millis/-micros/-nanos} as
     * {@link java.time.Instant}, {@code local-timestamp-*} as {@link java.time.LocalDateTime}, {@code date} as
     * {@link java.time.LocalDate}, {@code decimal} as {@link java.math.BigDecimal}, {@code uuid} as String;
     * records, arrays and maps as the decoding library's objects ({@code toString()} is their JSON).
     */
    Object get(String... path);
}
