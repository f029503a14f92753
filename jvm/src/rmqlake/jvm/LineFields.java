package rmqlake.jvm;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * A line's fields when the line is a flat JSON object of the known fields in the plain forms: strings without
 * escapes or control characters (valid UTF-8), integers without fraction or exponent that fit a long,
 * {@code keys} a string or a list of strings, {@code properties} an object of strings with distinct names.
 * {@code null} from {@link #read} for anything else (an unknown or repeated field, a line that is not JSON, an
 * end line, a delay level or timer field, a value of another type): the per-line parser decides those.
 */
final class LineFields {
    String topic;
    Long queueId;
    int bodyStart = -1; // the body string's bytes in the line (without its quotes)
    int bodyEnd = -1;
    String bodyEncoding;
    String keys;
    List<String> keyList;
    String tags;
    List<String[]> properties;
    String uniqKey;
    Long flag;
    Long bornTimestamp;
    Long storeTimestamp;
    String bornHost;
    String storeHost;
    Long reconsumeTimes;
    Long preparedTransactionOffset;
    String transaction;
    boolean hasBody;

    private final byte[] line;
    private final int end;
    private int at;

    private LineFields(byte[] line, int start, int end) {
        this.line = line;
        this.at = start;
        this.end = end;
    }

    /** The fields of {@code line[start, end)}, or {@code null} when the line is not in the plain forms. */
    static LineFields read(byte[] line, int start, int end) {
        LineFields fields = new LineFields(line, start, end);
        try {
            return fields.object() ? fields : null;
        } catch (Refused refused) {
            return null;
        }
    }

    /** Not in the plain forms: the line goes to the per-line parser. */
    private static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;
        private static final Refused INSTANCE = new Refused();

        private Refused() {
            super(null, null, false, false);
        }
    }

    private static Refused refused() {
        return Refused.INSTANCE;
    }

    // The fields a line may have, by number; names are matched as bytes (no String per field name).
    private static final String[] NAMES = {
        "topic", "queueId", "body", "bodyEncoding", "keys", "tags", "properties", "uniqKey", "flag", "bornTimestamp",
        "storeTimestamp", "bornHost", "storeHost", "reconsumeTimes", "preparedTransactionOffset", "transaction",
        // fields of re-routed messages and end lines: null only (absent), else the per-line parser decides
        "delayLevel", "deliverTimeMs", "endTransaction", "producerGroup", "fromTransactionCheck",
    };
    private static final byte[][] NAME_BYTES = new byte[NAMES.length][];
    private static final int BODY = 2;
    private static final VarHandle WORDS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long ONES = 0x0101010101010101L;
    private static final long HIGHS = 0x8080808080808080L;

    /** Whether one of the 8 bytes of {@code word} is a quote, a backslash or below 0x20 (each test is the "has a
     * zero byte" trick, which a borrow can only make say yes where a byte did match; bytes of 0x80 and above are
     * never matched). */
    private static boolean stopsScan(long word) {
        long quote = word ^ (ONES * '"');
        long backslash = word ^ (ONES * '\\');
        long found = ((quote - ONES) & ~quote) | ((backslash - ONES) & ~backslash) | ((word - ONES * 0x20) & ~word);
        return (found & HIGHS) != 0;
    }

    /** Bytes that end a string's scan: the quote, the backslash, control characters. */
    private static final boolean[] STOPS = new boolean[256];

    static {
        for (int b = 0; b < 0x20; b++) {
            STOPS[b] = true;
        }
        STOPS['"'] = true;
        STOPS['\\'] = true;
    }

    static {
        for (int i = 0; i < NAMES.length; i++) {
            NAME_BYTES[i] = NAMES[i].getBytes(StandardCharsets.US_ASCII);
        }
    }

    private boolean object() throws Refused {
        space();
        expect('{');
        space();
        int seen = 0;
        if (peek() == '}') {
            at++;
        } else {
            while (true) {
                int field = fieldName();
                if ((seen & (1 << field)) != 0) {
                    throw refused(); // a repeated field
                }
                seen |= 1 << field;
                space();
                expect(':');
                space();
                value(field);
                space();
                byte next = next();
                if (next == '}') {
                    break;
                }
                if (next != ',') {
                    throw refused();
                }
                space();
            }
        }
        space();
        return at == end;
    }

    /** The number of the field whose quoted name starts here; refused for an unknown name. */
    private int fieldName() throws Refused {
        expect('"');
        int start = at;
        while (at < end && line[at] != '"') {
            at++;
        }
        if (at >= end) {
            throw refused();
        }
        int length = at - start;
        at++;
        for (int i = 0; i < NAME_BYTES.length; i++) {
            byte[] name = NAME_BYTES[i];
            if (name.length == length && Arrays.equals(line, start, start + length, name, 0, length)) {
                return i;
            }
        }
        throw refused(); // an unknown field (or an escape in a name): the per-line parser decides
    }

    private void value(int field) throws Refused {
        if (isNull()) {
            if (field == BODY) {
                throw refused(); // a null body: the per-line parser says it is missing
            }
            return;
        }
        switch (field) {
            case 0: topic = string(); break;
            case 1: queueId = integer(); break;
            case BODY:
                expect('"');
                bodyStart = at;
                skipString();
                bodyEnd = at - 1;
                hasBody = true;
                break;
            case 3: bodyEncoding = string(); break;
            case 4:
                if (peek() == '[') {
                    keyList = stringList();
                } else {
                    keys = string();
                }
                break;
            case 5: tags = string(); break;
            case 6: properties = stringObject(); break;
            case 7: uniqKey = string(); break;
            case 8: flag = integer(); break;
            case 9: bornTimestamp = integer(); break;
            case 10: storeTimestamp = integer(); break;
            case 11: bornHost = string(); break;
            case 12: storeHost = string(); break;
            case 13: reconsumeTimes = integer(); break;
            case 14: preparedTransactionOffset = integer(); break;
            case 15: transaction = string(); break;
            default: throw refused(); // a delay level, timer or end-line field with a value
        }
    }

    private List<String> stringList() throws Refused {
        expect('[');
        space();
        List<String> out = new ArrayList<>();
        if (peek() == ']') {
            at++;
            return out;
        }
        while (true) {
            space();
            out.add(string());
            space();
            byte next = next();
            if (next == ']') {
                return out;
            }
            if (next != ',') {
                throw refused();
            }
        }
    }

    private List<String[]> stringObject() throws Refused {
        expect('{');
        space();
        List<String[]> out = new ArrayList<>();
        if (peek() == '}') {
            at++;
            return out;
        }
        Set<String> names = new HashSet<>();
        while (true) {
            space();
            String name = string();
            if (!names.add(name)) {
                throw refused(); // a repeated name: the per-line parser's dict decides which value stays
            }
            space();
            expect(':');
            space();
            out.add(new String[] {name, string()});
            space();
            byte next = next();
            if (next == '}') {
                return out;
            }
            if (next != ',') {
                throw refused();
            }
        }
    }

    private String string() throws Refused {
        expect('"');
        int start = at;
        boolean ascii = skipString();
        int stop = at - 1;
        return new String(line, start, stop - start, ascii ? StandardCharsets.ISO_8859_1 : StandardCharsets.UTF_8);
    }

    /** Past the closing quote of a string whose opening quote is read, its bytes checked to be UTF-8; whether it
     * is all ASCII. The end is found eight bytes at a time (a quote, a backslash or a control character stops the
     * scan; bytes of multi-byte characters do not), then the bytes are checked for UTF-8. */
    private boolean skipString() throws Refused {
        final byte[] bytes = line;
        final int stop = end;
        final int start = at;
        int i = start;
        while (i + 8 <= stop && !stopsScan((long) WORDS.get(bytes, i))) {
            i += 8;
        }
        while (i < stop && !STOPS[bytes[i] & 0xFF]) {
            i++;
        }
        if (i >= stop || bytes[i] != '"') {
            throw refused(); // no closing quote, an escape or a control character: the per-line parser decides
        }
        at = i + 1;
        int kind = Utf8.classify(bytes, start, i);
        if (kind == Utf8.INVALID) {
            throw refused(); // not UTF-8: the per-line parser says where
        }
        return kind == Utf8.ASCII;
    }

    private Long integer() throws Refused {
        boolean negative = false;
        if (peek() == '-') {
            negative = true;
            at++;
        }
        int start = at;
        long value = 0;
        while (at < end && line[at] >= '0' && line[at] <= '9') {
            int digit = line[at++] - '0';
            if (value > (Long.MAX_VALUE - digit) / 10) {
                throw refused(); // beyond a long: the per-line parser gives the range
            }
            value = value * 10 + digit;
        }
        int digits = at - start;
        if (digits == 0 || (digits > 1 && line[start] == '0')) {
            throw refused();
        }
        if (at < end && (line[at] == '.' || line[at] == 'e' || line[at] == 'E')) {
            throw refused();
        }
        return negative ? -value : value;
    }

    private boolean isNull() {
        if (end - at >= 4 && line[at] == 'n' && line[at + 1] == 'u' && line[at + 2] == 'l' && line[at + 3] == 'l') {
            at += 4;
            return true;
        }
        return false;
    }

    private void space() {
        while (at < end) {
            byte b = line[at];
            if (b != ' ' && b != '\t' && b != '\r' && b != '\n') {
                return;
            }
            at++;
        }
    }

    private byte peek() throws Refused {
        if (at >= end) {
            throw refused();
        }
        return line[at];
    }

    private byte next() throws Refused {
        if (at >= end) {
            throw refused();
        }
        return line[at++];
    }

    private void expect(char c) throws Refused {
        if (next() != c) {
            throw refused();
        }
    }
}
