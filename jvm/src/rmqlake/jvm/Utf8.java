package rmqlake.jvm;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/** Strict UTF-8, as Python's codec decides: no overlong forms, no surrogates, nothing above U+10FFFF. */
final class Utf8 {
    private Utf8() {}

    static final int ASCII = 1;
    static final int MULTI_BYTE = 0;
    static final int INVALID = -1;

    /** {@link #ASCII} when {@code bytes[start, end)} are all ASCII, {@link #MULTI_BYTE} when they are valid UTF-8
     * with some multi-byte characters, {@link #INVALID} otherwise. ASCII is passed eight bytes at a time. */
    static int classify(byte[] bytes, int start, int end) {
        int at = start;
        while (at + 8 <= end && ((long) WORDS.get(bytes, at) & 0x8080808080808080L) == 0) {
            at += 8;
        }
        while (at < end && bytes[at] >= 0) {
            at++;
        }
        if (at == end) {
            return ASCII;
        }
        return valid(bytes, at, end) ? MULTI_BYTE : INVALID;
    }

    private static final VarHandle WORDS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    static boolean valid(byte[] bytes, int start, int end) {
        int at = start;
        while (at < end) {
            int b = bytes[at];
            if (b >= 0) { // ASCII: the run goes on eight bytes at a time
                at++;
                while (at + 8 <= end && ((long) WORDS.get(bytes, at) & 0x8080808080808080L) == 0) {
                    at += 8;
                }
                continue;
            }
            int lead = LEADS[b & 0xFF];
            int need = lead & 3;
            if (need == 0 || at + need >= end) {
                return false; // not a lead byte, or fewer continuation bytes than it needs
            }
            int second = bytes[at + 1] & 0xFF;
            if (second < ((lead >>> 8) & 0xFF) || second > (lead >>> 16)) {
                return false;
            }
            if (need > 1 && (bytes[at + 2] & 0xC0) != 0x80 || need > 2 && (bytes[at + 3] & 0xC0) != 0x80) {
                return false;
            }
            at += need + 1;
        }
        return true;
    }

    /** Per lead byte: the continuation bytes it needs (bits 0-1; 0: not a lead byte) and the range of the one
     * after it (bits 8-15 and 16-23), which rules out overlong forms, surrogates and code points past U+10FFFF. */
    private static final int[] LEADS = new int[256];

    static {
        for (int b = 0xC2; b <= 0xDF; b++) {
            LEADS[b] = lead(1, 0x80, 0xBF);
        }
        for (int b = 0xE0; b <= 0xEF; b++) {
            LEADS[b] = lead(2, b == 0xE0 ? 0xA0 : 0x80, b == 0xED ? 0x9F : 0xBF);
        }
        for (int b = 0xF0; b <= 0xF4; b++) {
            LEADS[b] = lead(3, b == 0xF0 ? 0x90 : 0x80, b == 0xF4 ? 0x8F : 0xBF);
        }
    }

    private static int lead(int need, int low, int high) {
        return need | low << 8 | high << 16;
    }
}
