package io.kdq.spark.registry;

import java.io.IOException;

/** Bytes that break the binary encoding (a length past the end, an overlong varint...). No stack trace: cheap. */
final class MalformedData extends IOException {
    private static final long serialVersionUID = 1L;

    MalformedData(String message) {
        super(message);
    }

    @Override
    public synchronized Throwable fillInStackTrace() {
        return this;
    }
}
