package io.kdq.spark.registry;

/**
 * What {@link RegistryDecoder#decode} found: {@link #problem} is null when the value decoded (then
 * {@link #record} is the decoded record), else a {@link RegistryReasons} string. {@link #schemaId} is the header's
 * id, -1 without a header.
 */
public final class Verdict {
    public final String problem;
    public final int schemaId;
    public final DecodedRecord record;

    private Verdict(String problem, int schemaId, DecodedRecord record) {
        this.problem = problem;
        this.schemaId = schemaId;
        this.record = record;
    }

    static Verdict problem(String problem, int schemaId) {
        return new Verdict(problem, schemaId, null);
    }

    static Verdict decoded(int schemaId, DecodedRecord record) {
        return new Verdict(null, schemaId, record);
    }

    @Override
    public String toString() {
        return problem == null ? "decoded(id " + schemaId + ")" : problem + "(id " + schemaId + ")";
    }
}
