package io.kdq.spark.registry;

/**
 * The registry could not answer (connection refused, timeout, 5xx, 401/403, an unreadable answer) a question
 * whose answer is not cached yet. Never a verdict: the caller fails the task or batch, and the retry
 * (Spark's task retry, the stream's next attempt at the same offsets) decides the record once the registry is
 * back. Ids already seen never raise it (their answers are cached for the life of the JVM).
 */
public class RegistryUnavailableException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public RegistryUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
