package io.kdq.spark.classify;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Random;

import org.junit.jupiter.api.Test;

/** {@link Utf8#isValid} against the JDK's strict UTF-8 decoder, which it replaces. */
class Utf8Test {

    private static boolean jdk(byte[] value) {
        CharsetDecoder decoder = StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT);
        try {
            decoder.decode(ByteBuffer.wrap(value));
            return true;
        } catch (CharacterCodingException e) {
            return false;
        }
    }

    private static void same(byte[] value) {
        assertEquals(jdk(value), Utf8.isValid(value), () -> HexFormat.of().formatHex(value));
    }

    @Test
    void everySequenceOfUpToThreeBytes() {
        for (int a = 0; a < 256; a++) {
            same(new byte[] {(byte) a});
            for (int b = 0; b < 256; b++) {
                same(new byte[] {(byte) a, (byte) b});
                if (a >= 0xC0) {
                    for (int c = 0; c < 256; c += 7) {
                        same(new byte[] {(byte) a, (byte) b, (byte) c});
                        same(new byte[] {(byte) 'x', (byte) a, (byte) b, (byte) c, (byte) 'y'});
                    }
                }
            }
        }
    }

    @Test
    void fourByteSequencesAtTheirEdges() {
        int[] edges = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF};
        for (int a = 0xF0; a <= 0xFF; a++) {
            for (int b : edges) {
                for (int c : edges) {
                    for (int d : edges) {
                        same(new byte[] {(byte) a, (byte) b, (byte) c, (byte) d});
                        same(new byte[] {(byte) a, (byte) b, (byte) c});
                    }
                }
            }
        }
    }

    @Test
    void randomStringsOfMostlyValidText() {
        Random random = new Random(24);
        String[] pieces = {"a", "{\"k\":1}", "é", "€", "😀", "\u07FF", "\uFFFF", "\uD7FF", "\uE000"};
        for (int i = 0; i < 20_000; i++) {
            StringBuilder text = new StringBuilder();
            for (int j = random.nextInt(8); j >= 0; j--) {
                text.append(pieces[random.nextInt(pieces.length)]);
            }
            byte[] value = text.toString().getBytes(StandardCharsets.UTF_8);
            same(value);
            if (value.length > 0) {
                byte[] broken = value.clone();
                broken[random.nextInt(broken.length)] = (byte) random.nextInt(256);
                same(broken);
                same(java.util.Arrays.copyOf(value, random.nextInt(value.length)));
            }
        }
    }
}
