package io.kdq.spark.summary;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.sql.Row;
import org.junit.jupiter.api.Test;

/** The summaries' field reader; its equality with Python and with Spark's VARIANT functions is tested from Python. */
class SummaryValuesTest {
    /** amount (3 digits) grouped by currency and customer.tier; amount in steps of 0.5 without groups. */
    private static final String CONFIG = "{\"max_nesting_depth\":50,\"summaries\":["
            + "{\"value\":[\"amount\"],\"group_by\":[[\"currency\"],[\"customer\",\"tier\"]],\"digits\":3},"
            + "{\"value\":[\"amount\"],\"group_by\":[],\"digits\":3,\"step\":0.5,\"step_mantissa\":5,\"step_exponent\":-1}]}";

    private static List<Row> read(String json) {
        SummaryValues.check(CONFIG);
        return new SummaryValues(CONFIG).call(json == null ? null : json.getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void readsValueBucketAndGroupsInOnePass() {
        List<Row> out = read("{\"id\":1,\"customer\":{\"name\":\"x\",\"tier\":\"gold\"},\"items\":[{\"amount\":3}],"
                + "\"currency\":\"EUR\",\"amount\":123.456}");
        assertEquals(2, out.size());
        assertEquals(123.456, out.get(0).getDouble(0));
        assertEquals(123.0, out.get(0).getDouble(1));
        assertNull(out.get(0).get(2));
        assertEquals(Arrays.asList("EUR", "gold"), out.get(0).get(3));
        assertEquals(123.0, out.get(1).getDouble(1)); // steps of 0.5
        assertEquals(List.of(), out.get(1).get(3));
    }

    @Test
    void stopsReadingOnceItHasEveryField() {
        // Fields first, then bytes it never reads: the same entries as with the fields last (read to the end).
        String fields = "\"currency\":\"EUR\",\"customer\":{\"tier\":\"gold\",\"id\":\"c-1\"},\"amount\":12.5";
        String rest = "\"lines\":[{\"sku\":\"a\",\"qty\":1},{\"sku\":\"b\",\"note\":{\"x\":[1,2,{}]}}],\"z\":null";
        assertEquals(read("{" + rest + "," + fields + "}"), read("{" + fields + "," + rest + "}"));
        // A field set to null counts as read (its first occurrence is its only one in a valid record).
        List<Row> nullTier = read("{\"customer\":{\"tier\":null},\"currency\":\"EUR\",\"amount\":1," + rest + "}");
        assertEquals(Arrays.asList("EUR", null), nullTier.get(0).get(3));
        // Tokens after the last field are not read at all (a valid record has none that could fail).
        assertEquals(12.5, read("{" + fields + ",\"lines\":[" + "x".repeat(10) + "]}").get(0).getDouble(0));
        // Without every field it reads to the end: a document that then breaks gives every field as missing.
        assertEquals("missing", read("{\"amount\":1,\"currency\":\"EUR\",\"lines\":[").get(0).getString(2));
    }

    @Test
    void rejectsWithTheReasonsOfThePythonDefinition() {
        assertEquals("missing", read("{\"currency\":\"EUR\"}").get(0).getString(2));
        assertEquals("missing", read("{\"amount\":null}").get(0).getString(2));
        assertEquals("not_numeric", read("{\"amount\":\"12\"}").get(0).getString(2));
        assertEquals("not_numeric", read("{\"amount\":true}").get(0).getString(2));
        assertEquals("out_of_range", read("{\"amount\":1e400}").get(0).getString(2));
        assertEquals("out_of_range", read("{\"amount\":1e151}").get(0).getString(2));
        assertEquals("out_of_range", read("{\"amount\":1e12}").get(1).getString(2)); // 2e12 steps of 0.5
        assertNull(read("{\"amount\":1e12}").get(0).get(2));
    }

    @Test
    void neverThrowsOnWhatItCannotRead() {
        for (String bad : new String[] {null, "", "not json", "[1,2]", "5", "{\"amount\":", "{\"a\":" + "[".repeat(100) + "}"}) {
            List<Row> out = read(bad);
            assertEquals("missing", out.get(0).getString(2), String.valueOf(bad));
            assertEquals(Arrays.asList(null, null), out.get(0).get(3));
        }
    }

    @Test
    void groupValuesAsSparkVariantText() {
        assertEquals("1.5", SummaryValues.text(SummaryValues.number("1.50", false)));
        assertEquals("100000.0", SummaryValues.text(SummaryValues.number("1e5", false)));
        assertEquals("0.000000001", SummaryValues.text(SummaryValues.number("0.000000001", false)));
        assertEquals("12345678901234567890", SummaryValues.text(SummaryValues.number("12345678901234567890", true)));
        assertEquals(Arrays.asList("{\"a\":[1,2.5],\"b\":\"x\"}", null),
                read("{\"currency\":{\"b\":\"x\",\"a\":[1,2.50]},\"amount\":1}").get(0).get(3));
    }

    @Test
    void bucketsAtTheEdges() {
        assertEquals(0.0, SummaryValues.bucket(1e-301, 3));
        assertEquals(9.99, SummaryValues.bucket(9.995, 3));
        assertEquals(-12.3, SummaryValues.bucket(-12.345, 3));
        assertEquals(1e150, SummaryValues.bucket(1e150, 3));
        assertEquals(-1.0, SummaryValues.stepBucket(-0.7, 5, -1));
    }

    @Test
    void refusesABrokenConfiguration() {
        assertThrows(IllegalArgumentException.class, () -> SummaryValues.check("{\"summaries\":[{\"value\":[]}]}"));
    }

    @Test
    void survivesSerialization() throws Exception {
        SummaryValues.check(CONFIG);
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
            out.writeObject(new SummaryValues(CONFIG));
        }
        try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
            SummaryValues copy = (SummaryValues) in.readObject();
            assertEquals(2.0, copy.call("{\"amount\":2}".getBytes(StandardCharsets.UTF_8)).get(0).getDouble(0));
        }
    }
}
