package io.kdq.spark.registry;

import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;

/** An 'orders'-like Avro schema (nested record, array of records, enums, union, map, logical types) and a record. */
public final class Orders {
    public static final String SCHEMA = """
            {"type":"record","name":"Order","namespace":"io.kdq.demo","fields":[
             {"name":"order_id","type":"string"},
             {"name":"id","type":{"type":"string","logicalType":"uuid"}},
             {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
             {"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD","GBP"]}},
             {"name":"placed_at","type":{"type":"long","logicalType":"timestamp-millis"}},
             {"name":"day","type":{"type":"int","logicalType":"date"}},
             {"name":"customer","type":{"type":"record","name":"Customer","fields":[
               {"name":"id","type":"string"},{"name":"name","type":"string"},
               {"name":"tier","type":{"type":"enum","name":"Tier","symbols":["BRONZE","SILVER","GOLD"]}}]}},
             {"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[
               {"name":"sku","type":"string"},{"name":"qty","type":"int"},{"name":"price","type":"double"}]}}},
             {"name":"note","type":["null","string"],"default":null},
             {"name":"attrs","type":{"type":"map","values":"string"}},
             {"name":"gift","type":"boolean"}]}""";

    public static final Schema PARSED = new Schema.Parser().parse(SCHEMA);

    private Orders() {
    }

    /** An order with {@code lines} lines (about 1 KB with 28). */
    public static GenericRecord order(int lines, String note) {
        GenericRecord o = new GenericData.Record(PARSED);
        o.put("order_id", "o-0001-2023-11-14-000123");
        o.put("id", "6f1c2c1e-8d7a-4a53-9a43-2b0c6f0e9d11");
        o.put("amount", ByteBuffer.wrap(new BigDecimal("1234.50").unscaledValue().toByteArray()));
        o.put("currency", new GenericData.EnumSymbol(PARSED.getField("currency").schema(), "EUR"));
        o.put("placed_at", 1700000000123L);
        o.put("day", 19675);
        Schema cs = PARSED.getField("customer").schema();
        GenericRecord c = new GenericData.Record(cs);
        c.put("id", "c-000042");
        c.put("name", "Ada Lovelace");
        c.put("tier", new GenericData.EnumSymbol(cs.getField("tier").schema(), "GOLD"));
        o.put("customer", c);
        Schema ls = PARSED.getField("lines").schema();
        List<GenericRecord> list = new ArrayList<>();
        for (int i = 0; i < lines; i++) {
            GenericRecord l = new GenericData.Record(ls.getElementType());
            l.put("sku", "SKU-" + (10000 + i) + "-blue-xl");
            l.put("qty", 1 + i % 5);
            l.put("price", 9.99 + i);
            list.add(l);
        }
        o.put("lines", new GenericData.Array<>(ls, list));
        o.put("note", note);
        Map<String, String> attrs = new HashMap<>();
        attrs.put("channel", "web");
        attrs.put("source", "demo");
        o.put("attrs", attrs);
        o.put("gift", false);
        return o;
    }
}
