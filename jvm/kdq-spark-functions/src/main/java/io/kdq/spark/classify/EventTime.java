package io.kdq.spark.classify;

import java.math.BigInteger;
import java.time.DateTimeException;
import java.time.LocalDate;

import tools.jackson.databind.JsonNode;

/**
 * Event time of a record: the rule's field (a list of member names walked through the parsed
 * JSON) read as epoch milliseconds. Returns null when the field is missing or unusable (the
 * record's {@code event_time_bad}). Accepted values lie in [1970-01-01T00:00:00Z,
 * 9999-12-31T23:59:59.999Z]; nothing here can overflow.
 */
final class EventTime {
    static final long MIN_MS = 0L;
    static final long MAX_MS = 253_402_300_799_999L;
    private static final BigInteger MAX_BIG = BigInteger.valueOf(MAX_MS);
    /** Longer strings are never a timestamp (the longest accepted ISO form has 35 characters). */
    private static final int MAX_STRING = 64;

    enum Format {
        AUTO, EPOCH_MILLIS, ISO8601;

        static Format of(String name) {
            if (name == null || name.equals("auto")) {
                return AUTO;
            }
            switch (name) {
                case "epoch_millis":
                    return EPOCH_MILLIS;
                case "iso8601":
                    return ISO8601;
                default:
                    throw new IllegalArgumentException("unknown event_time_format '" + name
                            + "' (expected auto, epoch_millis or iso8601)");
            }
        }
    }

    private EventTime() {
    }

    static Long read(JsonNode doc, String[] field, Format format) {
        JsonNode node = doc;
        for (String name : field) {
            if (node == null || !node.isObject()) {
                return null;
            }
            node = node.get(name);
        }
        return node == null ? null : readValue(node, format);
    }

    /** The event time in the field's value ({@link #read} once the field is found). */
    static Long readValue(JsonNode node, Format format) {
        switch (format) {
            case EPOCH_MILLIS:
                return node.isString() ? digits(node.asString()) : integral(node);
            case ISO8601:
                return node.isString() ? iso(node.asString()) : null;
            default:
                if (node.isNumber()) {
                    return integral(node);
                }
                if (!node.isString()) {
                    return null;
                }
                String s = node.asString();
                return looksNumeric(s) ? digits(s) : iso(s);
        }
    }

    /**
     * The event time of a record decoded through the Schema Registry ({@code value}: what
     * {@link io.kdq.spark.registry.DecodedRecord#get} returned for the field). A timestamp logical type is its
     * instant whatever the format says ({@code local-timestamp-*} and {@code date} read as UTC, like an ISO-8601
     * text without a zone); integers and texts follow {@code format} as they do in JSON; anything else (floats,
     * records, bytes) is no event time.
     */
    static Long readDecoded(Object value, Format format) {
        if (value == null) {
            return null;
        }
        if (value instanceof java.time.Instant instant) {
            return instant.isBefore(java.time.Instant.EPOCH) || instant.isAfter(java.time.Instant.ofEpochMilli(MAX_MS))
                    ? null : instant.toEpochMilli();
        }
        if (value instanceof java.time.LocalDateTime local) {
            return readDecoded(local.toInstant(java.time.ZoneOffset.UTC), format);
        }
        if (value instanceof java.time.LocalDate date) {
            return readDecoded(date.atStartOfDay(java.time.ZoneOffset.UTC).toInstant(), format);
        }
        if (value instanceof Long || value instanceof Integer) {
            return format == Format.ISO8601 ? null : inRange(((Number) value).longValue());
        }
        if (value instanceof CharSequence text) {
            String s = text.toString();
            switch (format) {
                case EPOCH_MILLIS:
                    return digits(s);
                case ISO8601:
                    return iso(s);
                default:
                    return looksNumeric(s) ? digits(s) : iso(s);
            }
        }
        return null;
    }

    /** An integer literal (int, long or big integer node) within range; floats are refused. */
    static Long integral(JsonNode node) {
        if (!node.isIntegralNumber()) {
            return null;
        }
        if (node.isBigInteger()) {
            BigInteger v = node.bigIntegerValue();
            return v.signum() < 0 || v.compareTo(MAX_BIG) > 0 ? null : v.longValue();
        }
        return inRange(node.longValue());
    }

    private static boolean looksNumeric(String s) {
        int start = s.startsWith("-") ? 1 : 0;
        if (s.length() == start) {
            return false;
        }
        for (int i = start; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < '0' || c > '9') {
                return false;
            }
        }
        return true;
    }

    /** 1 to 15 ASCII digits with an optional leading minus. */
    static Long digits(String s) {
        int start = s.startsWith("-") ? 1 : 0;
        int n = s.length() - start;
        if (n < 1 || n > 15) {
            return null;
        }
        long v = 0;
        for (int i = start; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < '0' || c > '9') {
                return null;
            }
            v = v * 10 + (c - '0'); // at most 15 digits: no overflow
        }
        return inRange(start == 1 ? -v : v);
    }

    private static Long inRange(long ms) {
        return ms < MIN_MS || ms > MAX_MS ? null : ms;
    }

    /**
     * {@code YYYY-MM-DD}, optionally followed by {@code T} or a space, {@code hh:mm[:ss[.fraction]]}
     * and an optional zone ({@code Z}, {@code ±hh:mm}, {@code ±hhmm}, {@code ±hh}); no zone means
     * UTC, a date alone is midnight UTC. Fractions beyond milliseconds are truncated.
     */
    static Long iso(String s) {
        int n = s.length();
        if (n < 10 || n > MAX_STRING) {
            return null;
        }
        int year = num(s, 0, 4);
        if (year < 0 || s.charAt(4) != '-' || s.charAt(7) != '-') {
            return null;
        }
        int month = num(s, 5, 2);
        int day = num(s, 8, 2);
        if (month < 0 || day < 0) {
            return null;
        }
        long epochDay;
        try {
            epochDay = LocalDate.of(year, month, day).toEpochDay();
        } catch (DateTimeException e) {
            return null;
        }
        long seconds = 0;
        long millis = 0;
        long offsetSeconds = 0;
        int i = 10;
        if (i < n) {
            char sep = s.charAt(i);
            if (sep != 'T' && sep != 't' && sep != ' ') {
                return null;
            }
            i++;
            if (i + 5 > n || s.charAt(i + 2) != ':') {
                return null;
            }
            int hour = num(s, i, 2);
            int minute = num(s, i + 3, 2);
            if (hour < 0 || hour > 23 || minute < 0 || minute > 59) {
                return null;
            }
            i += 5;
            int second = 0;
            if (i < n && s.charAt(i) == ':') {
                if (i + 3 > n) {
                    return null;
                }
                second = num(s, i + 1, 2);
                if (second < 0 || second > 59) {
                    return null;
                }
                i += 3;
                if (i < n && (s.charAt(i) == '.' || s.charAt(i) == ',')) {
                    i++;
                    int digits = 0;
                    while (i < n && s.charAt(i) >= '0' && s.charAt(i) <= '9') {
                        if (digits < 3) {
                            millis = millis * 10 + (s.charAt(i) - '0');
                        }
                        digits++;
                        i++;
                    }
                    if (digits == 0 || digits > 9) {
                        return null;
                    }
                    for (int d = digits; d < 3; d++) {
                        millis *= 10;
                    }
                }
            }
            seconds = hour * 3600L + minute * 60L + second;
            if (i < n) {
                char z = s.charAt(i);
                if ((z == 'Z' || z == 'z') && i + 1 == n) {
                    i++;
                } else if (z == '+' || z == '-') {
                    int rest = n - i - 1;
                    int oh;
                    int om = 0;
                    if (rest == 2) {
                        oh = num(s, i + 1, 2);
                    } else if (rest == 4) {
                        oh = num(s, i + 1, 2);
                        om = num(s, i + 3, 2);
                    } else if (rest == 5 && s.charAt(i + 3) == ':') {
                        oh = num(s, i + 1, 2);
                        om = num(s, i + 4, 2);
                    } else {
                        return null;
                    }
                    if (oh < 0 || oh > 18 || om < 0 || om > 59) {
                        return null;
                    }
                    offsetSeconds = (z == '-' ? -1 : 1) * (oh * 3600L + om * 60L);
                    i = n;
                } else {
                    return null;
                }
            }
        }
        if (i != n) {
            return null;
        }
        // |epochDay| <= 3.7 million for years 0..9999: these products cannot overflow a long.
        long ms = epochDay * 86_400_000L + seconds * 1000L + millis - offsetSeconds * 1000L;
        return inRange(ms);
    }

    /** The non-negative number written with exactly {@code len} ASCII digits at {@code at}, else -1. */
    private static int num(String s, int at, int len) {
        if (at + len > s.length()) {
            return -1;
        }
        int v = 0;
        for (int i = at; i < at + len; i++) {
            char c = s.charAt(i);
            if (c < '0' || c > '9') {
                return -1;
            }
            v = v * 10 + (c - '0');
        }
        return v;
    }
}
