package io.kdq.spark.classify;

/** The reason strings of {@link Classifier#call}. */
final class Reasons {
    static final String TOO_LARGE = "too_large";
    static final String NULL_VALUE = "null_value";
    static final String NOT_UTF8 = "not_utf8";
    static final String NOT_JSON = "not_json";
    static final String TOO_COMPLEX = "too_complex";
    static final String SCHEMA_PREFIX = "schema:";
    static final String PATTERN_BUDGET_PREFIX = "pattern_budget:";
    static final String INTERNAL_ERROR_PREFIX = "internal_error:";

    private Reasons() {
    }

    static String internalError(Throwable t) {
        return INTERNAL_ERROR_PREFIX + t.getClass().getSimpleName();
    }
}
