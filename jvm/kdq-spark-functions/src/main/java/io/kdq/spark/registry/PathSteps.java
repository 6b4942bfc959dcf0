package io.kdq.spark.registry;

/** What the decoded records ({@link DecodedRecord}) share when they walk a path. */
final class PathSteps {
    private PathSteps() {
    }

    /** A path step as an array index: its decimal digits (at most 9, so it fits an int), else -1. */
    static int arrayIndex(String step) {
        if (step.isEmpty() || step.length() > 9) {
            return -1;
        }
        for (int i = 0; i < step.length(); i++) {
            if (step.charAt(i) < '0' || step.charAt(i) > '9') {
                return -1;
            }
        }
        return Integer.parseInt(step);
    }
}
