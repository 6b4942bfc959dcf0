package io.kdq.spark.registry;

import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.LongSupplier;
import java.util.function.Supplier;

/**
 * The registry's answers, asked once and kept for the life of the JVM: each schema id compiled once (its
 * decoder reused by every record and thread), each subject's ids, and the negative answers (an id the registry
 * does not have, an id that is not a version of a subject) for {@code recheckNanos}, after which the next record
 * carrying that id asks once more (a producer may have registered it since).
 *
 * <p>Outages: a positive answer never expires, so ids already seen decode exactly as before while the registry
 * is down; a negative answer whose re-check fails keeps its verdict. Only a question never answered raises
 * {@link RegistryUnavailableException} (a retried batch, never a verdict). No lock is held across records:
 * lookups are one concurrent-map read; a miss fetches under the id's (or subject's) own lock, so concurrent
 * tasks meeting a new id ask the registry once.
 */
public final class SchemaCache {
    private static final ConcurrentHashMap<String, SchemaCache> SHARED = new ConcurrentHashMap<>();
    /** Default re-check interval of negative answers. */
    public static final long DEFAULT_RECHECK_NANOS = 60_000_000_000L;

    /** Negative answers kept per cache (unknown ids) and per subject (ids not in it) before they are dropped. */
    static final int MAX_NEGATIVE = 100_000;

    private final java.util.concurrent.atomic.AtomicInteger negatives = new java.util.concurrent.atomic.AtomicInteger();
    private final SchemaSource source;
    private final long recheckNanos;
    private final LongSupplier clock;
    private final ConcurrentHashMap<Integer, Entry> byId = new ConcurrentHashMap<>();
    private final ConcurrentHashMap<String, Subject> subjects = new ConcurrentHashMap<>();
    /** Referenced schemas by subject and version (immutable in a registry), shared by the schemas importing them. */
    private final ConcurrentHashMap<String, RegisteredSchema> references = new ConcurrentHashMap<>();

    public SchemaCache(SchemaSource source, long recheckNanos, LongSupplier clock) {
        this.source = source;
        this.recheckNanos = recheckNanos;
        this.clock = clock;
    }

    /**
     * The JVM-wide cache for one registry (key: its URL and a digest of its credentials), made with
     * {@code source} on first use: every task of an executor shares the compiled schemas.
     */
    public static SchemaCache shared(String key, Supplier<SchemaSource> source) {
        return SHARED.computeIfAbsent(key, k -> new SchemaCache(source.get(), DEFAULT_RECHECK_NANOS, System::nanoTime));
    }

    /** The compiled decoder of {@code id}, or null when the registry has no such id. */
    CompiledSchema schema(int id) {
        Entry e = byId.get(id);
        if (e != null && (e.schema != null || clock.getAsLong() - e.checkedAt < recheckNanos)) {
            return e.schema;
        }
        return fetch(id, e);
    }

    private CompiledSchema fetch(int id, Entry stale) {
        synchronized (lockFor(id)) {
            Entry e = byId.get(id);
            if (e != null && e != stale) {
                return e.schema; // another thread asked meanwhile
            }
            RegisteredSchema registered;
            try {
                registered = source.schemaById(id);
            } catch (RegistryUnavailableException ex) {
                if (stale != null) {
                    return stale.schema; // a negative answer keeps its verdict through an outage
                }
                throw ex;
            }
            CompiledSchema compiled = registered == null ? null : compile(id, registered);
            if (compiled == null && stale == null && negatives.incrementAndGet() > MAX_NEGATIVE) {
                // Values that only look framed (a first byte 0, random ids): forget the negative answers rather
                // than grow; each is asked again at most once per re-check interval anyway.
                byId.values().removeIf(x -> x.schema == null);
                negatives.set(0);
            }
            byId.put(id, new Entry(compiled, clock.getAsLong()));
            return compiled;
        }
    }

    /**
     * Asks the registry now (uncached) for {@code subject}'s versions: a job's start-up check that the registry
     * answers with these credentials. Throws {@link RegistryUnavailableException} when it does not.
     */
    int versionsNow(String subject) {
        return source.versions(subject).size();
    }

    /** True when {@code id} is one of the versions of {@code subject}. */
    boolean inSubject(String subject, int id) {
        return subjects.computeIfAbsent(subject, Subject::new).contains(id);
    }

    private CompiledSchema compile(int id, RegisteredSchema registered) {
        switch (registered.type()) {
            case RegisteredSchema.AVRO:
                return AvroSchemaDecoder.compile(id, registered, this::reference);
            case RegisteredSchema.PROTOBUF:
                return ProtobufSchemaDecoder.compile(id, registered, this::reference);
            case RegisteredSchema.JSON:
                return JsonSchemaDecoder.compile(id, registered, this::reference);
            default:
                return CompiledSchema.unsupported(id, registered.type());
        }
    }

    /** A referenced schema (subject, version): fetched once; an outage here is an outage of the id importing it. */
    RegisteredSchema reference(SchemaReference ref) {
        String key = ref.subject() + "\u0000" + ref.version();
        RegisteredSchema r = references.get(key);
        if (r == null) {
            SchemaSource.SubjectVersion v = source.version(ref.subject(), ref.version());
            if (v == null) {
                throw new IllegalArgumentException("reference " + ref.name() + ": no version " + ref.version()
                        + " of subject " + ref.subject());
            }
            r = v.schema();
            references.putIfAbsent(key, r);
        }
        return r;
    }

    /** Striped fetch locks: one per id would grow with every garbage id a topic carries. */
    private final Object[] stripes = new Object[64];

    {
        for (int i = 0; i < stripes.length; i++) {
            stripes[i] = new Object();
        }
    }

    private Object lockFor(int id) {
        return stripes[Math.floorMod(id, stripes.length)];
    }

    private static final class Entry {
        final CompiledSchema schema;
        final long checkedAt;

        Entry(CompiledSchema schema, long checkedAt) {
            this.schema = schema;
            this.checkedAt = checkedAt;
        }
    }

    /** One subject's known versions and ids, and the ids found not to be among them (with when). */
    private final class Subject {
        final String name;
        volatile Set<Integer> ids = Set.of();
        final Set<Integer> knownVersions = new HashSet<>();
        final Map<Integer, Long> notMember = new HashMap<>();

        Subject(String name) {
            this.name = name;
        }

        boolean contains(int id) {
            if (ids.contains(id)) {
                return true;
            }
            synchronized (this) {
                if (ids.contains(id)) {
                    return true;
                }
                Long checked = notMember.get(id);
                long now = clock.getAsLong();
                if (checked != null && now - checked < recheckNanos) {
                    return false;
                }
                try {
                    refresh();
                } catch (RegistryUnavailableException e) {
                    if (checked != null) {
                        return false; // judged before: the same verdict through an outage
                    }
                    throw e;
                }
                if (ids.contains(id)) {
                    notMember.remove(id);
                    return true;
                }
                if (notMember.size() >= MAX_NEGATIVE) {
                    notMember.clear();
                }
                notMember.put(id, clock.getAsLong());
                return false;
            }
        }

        /** Reads the versions added since the last refresh (versions are immutable: each is read once). */
        private void refresh() {
            List<Integer> versions = source.versions(name);
            Set<Integer> next = new HashSet<>(ids);
            for (int v : versions) {
                if (knownVersions.contains(v)) {
                    continue;
                }
                SchemaSource.SubjectVersion sv = source.version(name, v);
                if (sv != null) {
                    next.add(sv.id());
                }
                knownVersions.add(v);
                ids = Set.copyOf(next); // published per version: a failure half-way keeps what was read
            }
        }
    }
}
