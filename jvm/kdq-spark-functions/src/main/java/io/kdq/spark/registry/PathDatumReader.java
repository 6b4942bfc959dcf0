package io.kdq.spark.registry;

import java.io.IOException;
import java.util.HashMap;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.io.ResolvingDecoder;

/**
 * Avro's GenericDatumReader (writer schema = reader schema = the registered one) that says where a payload
 * stopped decoding: each record field, array element and map value catches a failure below it and adds its
 * step to the {@link DecodeFailure}'s path, on the way up only. Arrays and maps are read here (as Avro does,
 * without its reuse of old objects) so that the element's index or key is known, and so that a claimed count
 * never sizes an allocation: a 2^31-element claim in a few bytes fails when the bytes run out, and a count of
 * items that take no bytes at all (nulls, empty records) is capped at {@link #MAX_ZERO_WIDTH_ITEMS}.
 *
 * <p>Shared by every thread decoding with the schema: it holds no per-read state (Avro keeps its resolving
 * decoders per thread), and the fast reader, which bypasses these methods, is off in {@link #DATA}.
 */
final class PathDatumReader extends GenericDatumReader<Object> {
    static final int MAX_ZERO_WIDTH_ITEMS = 1 << 20;
    /** Avro's generic model without logical-type conversions: values stay as encoded ({@link AvroRecord} converts on read). */
    static final GenericData DATA = new GenericData();

    static {
        DATA.setFastReaderEnabled(false);
    }

    PathDatumReader(Schema schema) {
        super(schema, schema, DATA);
    }

    @Override
    protected void readField(Object record, Schema.Field field, Object oldDatum, ResolvingDecoder in, Object state)
            throws IOException {
        try {
            super.readField(record, field, null, in, state);
        } catch (DecodeFailure f) {
            throw f.under(field.name());
        } catch (IOException | RuntimeException e) {
            throw new DecodeFailure(e).under(field.name());
        }
    }

    @Override
    protected Object readArray(Object old, Schema expected, ResolvingDecoder in) throws IOException {
        Schema item = expected.getElementType();
        long n = in.readArrayStart();
        GenericData.Array<Object> array = new GenericData.Array<>((int) Math.min(n, 16), expected);
        long index = 0;
        boolean zeroWidth = n > 0 && zeroWidth(item, 0);
        while (n > 0) {
            if (zeroWidth && index + n > MAX_ZERO_WIDTH_ITEMS) {
                throw new MalformedData("more than " + MAX_ZERO_WIDTH_ITEMS + " items of no width");
            }
            for (long i = 0; i < n; i++, index++) {
                try {
                    array.add(read(null, item, in));
                } catch (DecodeFailure f) {
                    throw f.under(Long.toString(index));
                } catch (IOException | RuntimeException e) {
                    throw new DecodeFailure(e).under(Long.toString(index));
                }
            }
            n = in.arrayNext();
        }
        return array;
    }

    @Override
    protected Object readMap(Object old, Schema expected, ResolvingDecoder in) throws IOException {
        Schema value = expected.getValueType();
        long n = in.readMapStart();
        Map<Object, Object> map = new HashMap<>((int) Math.min(n, 16) * 2);
        while (n > 0) { // keys are strings: at least one byte each, so the bytes bound the count
            for (long i = 0; i < n; i++) {
                Object key = readMapKey(null, expected, in);
                try {
                    map.put(key, read(null, value, in));
                } catch (DecodeFailure f) {
                    throw f.under(key.toString());
                } catch (IOException | RuntimeException e) {
                    throw new DecodeFailure(e).under(key.toString());
                }
            }
            n = in.mapNext();
        }
        return map;
    }

    /** True when a value of {@code s} may take no bytes (null, fixed(0), a record of such), so counts need a cap. */
    static boolean zeroWidth(Schema s, int depth) {
        switch (s.getType()) {
            case NULL:
                return true;
            case FIXED:
                return s.getFixedSize() == 0;
            case RECORD:
                if (depth > 32) {
                    return true; // deep enough to be treated as possibly empty
                }
                for (Schema.Field f : s.getFields()) {
                    if (!zeroWidth(f.schema(), depth + 1)) {
                        return false;
                    }
                }
                return true;
            default:
                return false;
        }
    }
}
