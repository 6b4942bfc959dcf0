package io.kdq.spark.classify;

import com.networknt.schema.SchemaException;

/**
 * A regular expression used more than its work budget on one value. A SchemaException so that
 * networknt's pattern validator rethrows it as is (without logging every occurrence).
 */
final class PatternBudgetExceeded extends SchemaException {
    private static final long serialVersionUID = 1L;

    final String pointer;

    PatternBudgetExceeded(String pointer) {
        super("pattern work budget exceeded at " + pointer);
        this.pointer = pointer;
    }

    @Override
    public synchronized Throwable fillInStackTrace() {
        return this;
    }
}
