package io.kdq.spark.classify;

/**
 * Strict UTF-8 check: the well-formed byte sequences of the Unicode Standard (Table 3-7), which is what the JDK's
 * UTF-8 decoder accepts with {@code CodingErrorAction.REPORT}: no overlong forms, no encoded surrogates, nothing
 * above U+10FFFF, no truncated sequence. A test compares both on random and edge byte strings.
 *
 * <p>Why by hand: the decoder kept in a ThreadLocal cost ~2 % of a catch-up's CPU in the ThreadLocal lookup alone
 * (benchmarks/PERF_NOTES.md, twenty-first pass), and it decodes every character into a buffer it throws away.
 */
final class Utf8 {
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
        int n = value.length;
        int i = 0;
        while (i < n) {
            int b = value[i];
            if (b >= 0) {
                i++;
                continue;
            }
            b &= 0xFF;
            if (b >= 0xC2 && b <= 0xDF) {
                if (i + 1 >= n || !continuation(value[i + 1])) {
                    return false;
                }
                i += 2;
            } else if (b >= 0xE0 && b <= 0xEF) {
                if (i + 2 >= n) {
                    return false;
                }
                int b1 = value[i + 1] & 0xFF;
                int lo = b == 0xE0 ? 0xA0 : 0x80; // E0: no overlong
                int hi = b == 0xED ? 0x9F : 0xBF; // ED: no surrogate
                if (b1 < lo || b1 > hi || !continuation(value[i + 2])) {
                    return false;
                }
                i += 3;
            } else if (b >= 0xF0 && b <= 0xF4) {
                if (i + 3 >= n) {
                    return false;
                }
                int b1 = value[i + 1] & 0xFF;
                int lo = b == 0xF0 ? 0x90 : 0x80; // F0: no overlong
                int hi = b == 0xF4 ? 0x8F : 0xBF; // F4: nothing above U+10FFFF
                if (b1 < lo || b1 > hi || !continuation(value[i + 2]) || !continuation(value[i + 3])) {
                    return false;
                }
                i += 4;
            } else {
                return false; // a lone continuation byte, C0/C1 (overlong), F5-FF
            }
        }
        return true;
    }

    private static boolean continuation(byte b) {
        return (b & 0xC0) == 0x80;
    }
}
