package io.kdq.spark.classify;

/** JSON Pointer (RFC 6901) reference tokens, as the reasons name where a value failed: the classifier's
 * {@code schema:<pointer>} and the registry decoders' {@code avro:<pointer>}. */
public final class JsonPointer {
    private JsonPointer() {
    }

    /** One JSON-pointer reference token, escaped (~ as ~0, / as ~1). */
    public static void appendToken(StringBuilder sb, String token) {
        sb.append('/');
        for (int i = 0; i < token.length(); i++) {
            char c = token.charAt(i);
            if (c == '~') {
                sb.append("~0");
            } else if (c == '/') {
                sb.append("~1");
            } else {
                sb.append(c);
            }
        }
    }
}
