package io.kdq.spark.classify;

import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * Threads with a fixed, large stack ({@value #STACK_BYTES} bytes reserved, committed only as far as
 * used) for the work whose recursion grows with the input: a schema evaluated deeper than the
 * inline limit, a regular expression that recurses once per character on a long string, a
 * {@code format: regex} value with many nested groups. Verdicts must not depend on the stack of
 * the thread Spark happens to call the classifier on, so the classifier does on the calling thread
 * only what fits in a small, bounded part of any ordinary thread's stack, and everything else here,
 * where the limits the classifier applies first (evaluation depth, pattern work units) keep the
 * recursion well inside this stack. Idle threads end after 30 s (their stack memory with them).
 */
final class DeepStack {
    static final long STACK_BYTES = 512L << 20;

    private static final AtomicInteger COUNT = new AtomicInteger();
    private static final ThreadPoolExecutor POOL = new ThreadPoolExecutor(0, Integer.MAX_VALUE, 30, TimeUnit.SECONDS,
            new SynchronousQueue<>(), r -> {
                Thread t = new DeepThread(r, "kdq-deep-stack-" + COUNT.incrementAndGet());
                t.setDaemon(true);
                return t;
            });

    private DeepStack() {
    }

    /** A pool thread of this class. */
    private static final class DeepThread extends Thread {
        DeepThread(Runnable r, String name) {
            super(null, r, name, STACK_BYTES);
        }
    }

    /** The calling thread waited for a deep-stack task and was interrupted (a killed Spark task): never a verdict. */
    static final class Interrupted extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Interrupted(InterruptedException cause) {
            super("interrupted while waiting for a deep-stack evaluation", cause);
        }
    }

    static boolean onDeepStack() {
        return Thread.currentThread() instanceof DeepThread;
    }

    /**
     * {@code task} on a deep-stack thread (directly when already on one); the caller waits. What it
     * throws is rethrown as is: a RuntimeException, or an Error (never turned into a verdict).
     */
    static <T> T call(Supplier<T> task) {
        if (onDeepStack()) {
            return task.get();
        }
        Future<T> future = POOL.submit(task::get);
        try {
            return future.get();
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof RuntimeException) {
                throw (RuntimeException) cause;
            }
            if (cause instanceof Error) {
                throw (Error) cause;
            }
            throw new IllegalStateException(cause);
        } catch (InterruptedException e) {
            future.cancel(true);
            Thread.currentThread().interrupt();
            throw new Interrupted(e);
        }
    }
}
