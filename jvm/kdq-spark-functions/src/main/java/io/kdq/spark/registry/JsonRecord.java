package io.kdq.spark.registry;

import tools.jackson.databind.JsonNode;

/**
 * A JSON payload that passed its registry schema, read by path (object members, array indexes): strings as
 * String, integers as Integer/Long/BigInteger, other numbers as Double (BigDecimal past a double's range),
 * booleans as Boolean, JSON null as null; objects and arrays as Jackson's nodes ({@code toString()} is their JSON).
 */
final class JsonRecord implements DecodedRecord {
    final JsonNode doc;

    JsonRecord(JsonNode doc) {
        this.doc = doc;
    }

    @Override
    public Object get(String... path) {
        JsonNode node = doc;
        for (String step : path) {
            if (node == null) {
                return null;
            }
            if (node.isObject()) {
                node = node.get(step);
            } else if (node.isArray()) {
                int i = PathSteps.arrayIndex(step);
                node = i < 0 ? null : node.get(i);
            } else {
                return null;
            }
        }
        if (node == null || node.isNull() || node.isMissingNode()) {
            return null;
        }
        if (node.isString()) {
            return node.asString();
        }
        if (node.isNumber()) {
            return node.numberValue();
        }
        if (node.isBoolean()) {
            return node.booleanValue();
        }
        return node;
    }

    @Override
    public String toString() {
        return String.valueOf(doc);
    }
}
