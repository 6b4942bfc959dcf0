package io.kdq.spark.registry;

import io.kdq.spark.classify.JsonPointer;
import java.util.ArrayDeque;

/**
 * A payload that did not decode, with where: the path is built while the exception unwinds (each record field,
 * array element and map value adds its step), so decoding a good record pays nothing for it.
 */
final class DecodeFailure extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final transient ArrayDeque<String> path = new ArrayDeque<>();

    DecodeFailure(Throwable cause) {
        super(cause == null ? null : cause.toString(), cause, false, false);
    }

    DecodeFailure under(String step) {
        path.addFirst(step);
        return this;
    }

    /** The outermost step so far (null when none): a map entry's walk replaces its "value" step by the key. */
    String outermost() {
        return path.peekFirst();
    }

    /** Replaces the outermost step. */
    DecodeFailure replaceOutermost(String step) {
        path.pollFirst();
        path.addFirst(step);
        return this;
    }

    /** The JSON pointer (RFC 6901) of the value that did not decode; {@link RegistryReasons#ROOT} for the root. */
    String pointer() {
        if (path.isEmpty()) {
            return RegistryReasons.ROOT;
        }
        StringBuilder sb = new StringBuilder();
        for (String step : path) {
            JsonPointer.appendToken(sb, step);
        }
        return sb.toString();
    }
}
