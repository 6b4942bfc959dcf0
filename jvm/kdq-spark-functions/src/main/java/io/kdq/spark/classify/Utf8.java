package io.kdq.spark.classify;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;

/** Strict UTF-8 check: the JDK decoder with REPORT (no overlongs, no encoded surrogates, max U+10FFFF). */
final class Utf8 {
    private static final ThreadLocal<CharsetDecoder> DECODER = ThreadLocal.withInitial(() -> StandardCharsets.UTF_8
            .newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT));

    private Utf8() {
    }

    static boolean isAscii(byte[] value) {
        for (byte b : value) {
            if (b < 0) {
                return false;
            }
        }
        return true;
    }

    static boolean isValid(byte[] value) {
        if (isAscii(value)) {
            return true;
        }
        CharsetDecoder decoder = DECODER.get();
        decoder.reset();
        try {
            decoder.decode(ByteBuffer.wrap(value));
            return true;
        } catch (CharacterCodingException e) {
            return false;
        }
    }
}
