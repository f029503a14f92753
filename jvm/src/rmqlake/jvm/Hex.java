package rmqlake.jvm;

/** Upper-case hex text of bytes, as the broker writes message ids. */
final class Hex {
    private static final char[] DIGITS = "0123456789ABCDEF".toCharArray();

    private Hex() {}

    static String upper(byte[] bytes) {
        char[] out = new char[bytes.length * 2];
        for (int i = 0; i < bytes.length; i++) {
            out[2 * i] = DIGITS[(bytes[i] >>> 4) & 0xF];
            out[2 * i + 1] = DIGITS[bytes[i] & 0xF];
        }
        return new String(out);
    }

    /** {@code value}'s low {@code digits * 4} bits as {@code digits} upper-case hex digits. */
    static void append(StringBuilder out, long value, int digits) {
        for (int i = digits - 1; i >= 0; i--) {
            out.append(DIGITS[(int) ((value >>> (4 * i)) & 0xF)]);
        }
    }
}
