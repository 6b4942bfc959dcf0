package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** Confluent's header and Protobuf's message indexes. */
class WireFormatTest {
    @Test
    void header() {
        byte[] v = {0, 0x01, 0x02, 0x03, (byte) 0xff, 42};
        assertTrue(WireFormat.framed(v));
        assertEquals(0x010203ff, WireFormat.schemaId(v));
        assertFalse(WireFormat.framed(new byte[] {1, 0, 0, 0, 1}));
        assertFalse(WireFormat.framed(new byte[] {0, 0, 0, 1}));
        assertFalse(WireFormat.framed(null));
    }

    @Test
    void messageIndexes() {
        assertArrayEquals(new int[] {6, 0}, WireFormat.messageIndexes(new byte[] {0, 0, 0, 0, 1, 0, 9}, 5));
        // [1, 2]: count 2 (zig-zag 4), then 2 and 4
        assertArrayEquals(new int[] {8, 1, 2}, WireFormat.messageIndexes(new byte[] {0, 0, 0, 0, 1, 4, 2, 4}, 5));
        assertThrows(IllegalArgumentException.class, () -> WireFormat.messageIndexes(new byte[] {0, 0, 0, 0, 1, 4, 2}, 5));
        assertThrows(IllegalArgumentException.class, () -> WireFormat.messageIndexes(new byte[] {0, 0, 0, 0, 1, 1}, 5));
        assertThrows(IllegalArgumentException.class, () -> WireFormat.messageIndexes(new byte[] {0, 0, 0, 0, 1}, 5));
    }
}
