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

    /** Whether {@code bytes[start, end)} are strict UTF-8: a byte at a time through a DFA with no branch but the
     * loop's. Text mixing ASCII with other characters (words of a few letters between CJK characters, accented
     * letters inside words) changes kind every few bytes; a branch on each change (ASCII or not, which lead byte)
     * was mispredicted so often that the check of such bodies ran at ~0.4 GB/s.
     *
     * <p>Each transition waits for the one before; the row's lookup does not (it depends on the byte only), so
     * the wait is the shift alone: the state is kept as the shifted row, whose low six bits are the next shift
     * count, since a long's shift takes its count modulo 64. Masking it to six bits first, one more step in the
     * chain, checked mixed text at ~1.5 GB/s here, this at ~2.2 GB/s; cutting the bytes in four runs at
     * character starts, checked side by side, was slower than either. */
    static boolean valid(byte[] bytes, int start, int end) {
        long row = ACCEPT;
        for (int at = start; at < end; at++) {
            row = TRANSITIONS[bytes[at] & 0xFF] >>> row;
        }
        return ((int) row & 63) == ACCEPT;
    }

    /*
     * The DFA, shift-based: a state is the offset (a multiple of 6) of its 6-bit field in the 64-bit row of the
     * next byte, and that field holds the next state. Java's long shift takes its count modulo 64, so one lookup,
     * one shift and one mask make a transition. States: what the bytes read so far still need.
     */
    private static final int ACCEPT = 0; // at a character boundary
    private static final int NEED_1 = 1; // one continuation byte, 80-BF
    private static final int NEED_2 = 2; // two continuation bytes
    private static final int AFTER_E0 = 3; // A0-BF (no overlong 3-byte form), then one more
    private static final int AFTER_ED = 4; // 80-9F (no surrogate), then one more
    private static final int AFTER_F0 = 5; // 90-BF (no overlong 4-byte form), then two more
    private static final int NEED_3 = 6; // three continuation bytes (after F1-F3)
    private static final int AFTER_F4 = 7; // 80-8F (nothing past U+10FFFF), then two more
    private static final int ERROR = 8; // kept to the end
    private static final int STATES = 9;
    private static final long[] TRANSITIONS = new long[256];

    static {
        for (int b = 0; b < 256; b++) {
            long row = 0;
            for (int state = 0; state < STATES; state++) {
                row |= (long) (next(state, b) * 6) << (state * 6);
            }
            TRANSITIONS[b] = row;
        }
    }

    private static int next(int state, int b) {
        if (state == ACCEPT) {
            if (b < 0x80) {
                return ACCEPT;
            }
            if (b >= 0xC2 && b <= 0xDF) {
                return NEED_1;
            }
            if (b == 0xE0) {
                return AFTER_E0;
            }
            if (b == 0xED) {
                return AFTER_ED;
            }
            if (b >= 0xE1 && b <= 0xEF) {
                return NEED_2;
            }
            if (b == 0xF0) {
                return AFTER_F0;
            }
            if (b >= 0xF1 && b <= 0xF3) {
                return NEED_3;
            }
            return b == 0xF4 ? AFTER_F4 : ERROR; // 80-C1 and F5-FF start no character
        }
        if (b < 0x80 || b > 0xBF || state == ERROR) {
            return ERROR;
        }
        switch (state) {
            case NEED_1: return ACCEPT;
            case NEED_2: return NEED_1;
            case AFTER_E0: return b >= 0xA0 ? NEED_1 : ERROR;
            case AFTER_ED: return b <= 0x9F ? NEED_1 : ERROR;
            case AFTER_F0: return b >= 0x90 ? NEED_2 : ERROR;
            case NEED_3: return NEED_2;
            default: return b <= 0x8F ? NEED_2 : ERROR; // AFTER_F4
        }
    }
}
