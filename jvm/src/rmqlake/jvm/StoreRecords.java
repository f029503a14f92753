package rmqlake.jvm;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.zip.CRC32;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * The commitlog records of one piece of a broker store file, decoded for import-store: from a record start on, the
 * run of records that are messages passing every check the per-record reader ({@code rmqlake.store.imports}, the
 * reference) makes, as the commitlog rows it would give, to an Arrow IPC file.
 *
 * <p>The run ends before the first record that is anything else: the end-of-file blank, zeros, a damaged record, a
 * record crossing the end of the piece. Nothing is decided about that record here: the Python reader goes on from
 * it, so corrupt ranges, resyncing and the end of a file stay the reference's. A record is in the run when
 * <ul>
 *   <li>its magic code is V1 or V2 and its TOTALSIZE fits the piece and agrees with its fields (the size formula);
 *   <li>its PHYSICALOFFSET is where it is, its queue id is not negative, its body CRC is right ({@code checkCrc});
 *   <li>its hosts' ports are 0..65535 and an IPv6 field does not hold an IPv4-mapped address;
 *   <li>its topic passes the topic rules and its properties are UTF-8 as Python's codec decides.
 * </ul>
 *
 * <p>The rows are those of {@code IMPORTED} without the columns the same for every row of a piece (segment, batch
 * id, source file and line, the blank and corrupt flags), which the Python reader adds; properties are parsed as
 * {@code formats.properties.parse_properties} does (a repeated name keeps its first place and its last value). The
 * body is not copied: a row holds where it is in the file and its length, and the Python reader points at those
 * bytes of the file it maps (the bodies are most of a store's bytes).
 */
public final class StoreRecords {
    static final int BATCH_ROWS = 4096;
    static final int MAGIC_V1 = 0xDAA320A7;
    static final int MAGIC_V2 = 0xDAA320AB;
    /** The smallest record: IPv4 hosts, a V1 topic length byte, empty body, topic and properties. */
    static final int MIN_RECORD_SIZE = 74 + 8 + 8 + 1;
    /** A piece is mapped in windows of at most this many bytes. */
    static final long WINDOW_BYTES = 1L << 30;
    /** A bigger record ends the run and the Python reader reads it (a record is copied whole here; one under the
     * broker's default 4 MiB message limit is far smaller). */
    static final int MAX_RECORD_BYTES = 64 << 20;
    private static final int BORNHOST_V6_FLAG = 0x10;
    private static final int STOREHOST_V6_FLAG = 0x20;
    private static final int TOPIC_MAX_LENGTH = 127;
    private static final int RETRY_TOPIC_MAX_BYTES = 255;
    private static final byte[] RETRY_PREFIX = "%RETRY%".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    private static final boolean[] TOPIC_CHARS = new boolean[256];

    static {
        for (int c = 'a'; c <= 'z'; c++) {
            TOPIC_CHARS[c] = true;
            TOPIC_CHARS[c - 'a' + 'A'] = true;
        }
        for (int c = '0'; c <= '9'; c++) {
            TOPIC_CHARS[c] = true;
        }
        for (char c : "%|_-".toCharArray()) {
            TOPIC_CHARS[c] = true;
        }
    }

    private StoreRecords() {}

    /**
     * The pieces of {@code tasks} decoded lazily, in {@code slices} Spark partitions of consecutive pieces: a line
     * per piece in, its task number and a tab before the decode task (path, the file's first physical offset, the
     * piece's first byte, its end (-1: the file end), 1 to check body CRCs, the Arrow IPC path to write;
     * tab-separated, paths absolute and local); a line per piece out, its task number, then the position where the
     * run ended and the rows written, tab-separated; or "gave up" and the reason, for a piece this code failed on
     * (its file is not written, and the Python reader reads the whole piece). Python maps over the RDD, so a piece
     * is written by the Spark task that decoded it, as soon as it is decoded.
     */
    public static JavaRDD<String> decoding(JavaSparkContext context, String tasks, int slices) {
        List<String> lines = Arrays.asList(tasks.split("\n"));
        return context.parallelize(lines, slices).map(StoreRecords::decodeNumbered);
    }

    static String decodeNumbered(String line) throws IOException {
        int tab = line.indexOf('\t');
        if (tab < 0) {
            throw new IllegalArgumentException("a numbered decode task starts with its number and a tab");
        }
        return line.substring(0, tab) + "\t" + decodeTask(line.substring(tab + 1));
    }

    static String decodeTask(String taskLine) throws IOException {
        String[] task = taskLine.split("\t", -1);
        if (task.length != 6) {
            throw new IllegalArgumentException("a decode task has 6 tab-separated fields, not " + task.length);
        }
        Path out = Paths.get(task[5]);
        Files.createDirectories(out.getParent());
        String random = UUID.randomUUID().toString().replace("-", "").substring(0, 12);
        Path temporary = out.resolveSibling("." + out.getFileName() + "." + random + ".tmp");
        try {
            long[] reached;
            try {
                reached = decode(task[0], Long.parseLong(task[1]), Long.parseLong(task[2]), Long.parseLong(task[3]),
                        task[4].equals("1"), temporary.toString());
            } catch (UncheckedIOException e) {
                throw e;
            } catch (RuntimeException e) {
                String reason = e.getClass().getName() + ": " + e.getMessage();
                return "gave up\t" + reason.replaceAll("[\\t\\r\\n]", " ");
            }
            if (reached[1] > 0) {
                Files.move(temporary, out, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            }
            return reached[0] + "\t" + reached[1];
        } finally {
            Files.deleteIfExists(temporary);
        }
    }

    /**
     * The run of clean records of {@code path} from byte {@code start} up to {@code end} (-1: the file end), written
     * to {@code out} (when there is at least one): where the run ended and its records.
     */
    static long[] decode(String path, long startOffset, long start, long end, boolean checkCrc, String out)
            throws IOException {
        try (FileChannel channel = FileChannel.open(Paths.get(path), StandardOpenOption.READ);
                BufferAllocator allocator = new RootAllocator();
                Writer writer = new Writer(allocator, out)) {
            long limit = end < 0 ? channel.size() : Math.min(end, channel.size());
            long position = start;
            Decoder decoder = new Decoder(startOffset, checkCrc, writer);
            while (position < limit) {
                long window = Math.min(limit - position, WINDOW_BYTES);
                ByteBuffer data = channel.map(FileChannel.MapMode.READ_ONLY, position, window);
                int at = 0;
                while (window - at >= MIN_RECORD_SIZE) {
                    int size = data.getInt(at);
                    if (size < MIN_RECORD_SIZE || size > MAX_RECORD_BYTES || size > window - at
                            || !decoder.record(data, at, size, position + at)) {
                        break; // not clean, or crossing the end of the window: the reference's, or the next window's
                    }
                    at += size;
                }
                position += at;
                // a window short of the limit may have ended the run with a record crossing its end: go on in
                // the next one, which stops at once when the record there is not clean
                if (window < WINDOW_BYTES || at == 0) {
                    break;
                }
            }
            return new long[] {position, decoder.rows};
        }
    }

    private static final VarHandle INT = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle SHORT = MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.BIG_ENDIAN);

    static int intAt(byte[] b, int at) {
        return (int) INT.get(b, at);
    }

    static long longAt(byte[] b, int at) {
        return (long) LONG.get(b, at);
    }

    /** Checks the records and hands the clean ones' fields to the writer. */
    private static final class Decoder {
        private final long startOffset;
        private final boolean checkCrc;
        private final Writer writer;
        private final CRC32 crc = new CRC32();
        private final HostTexts bornHosts = new HostTexts();
        private final HostTexts storeHosts = new HostTexts();
        private byte[] b = new byte[64 * 1024]; // the record being checked
        long rows;

        Decoder(long startOffset, boolean checkCrc, Writer writer) {
            this.startOffset = startOffset;
            this.checkCrc = checkCrc;
            this.writer = writer;
        }

        /** Whether the record of {@code size} bytes at {@code data[from]} (file position {@code position}) is clean;
         * its row is written when it is. The record is copied whole first: then each field is an array read. */
        boolean record(ByteBuffer data, int from, int size, long position) throws IOException {
            if (size > b.length) {
                b = new byte[Math.max(size, 2 * b.length)];
            }
            data.get(from, b, 0, size);
            int at = 0; // the record's start in b
            int magic = intAt(b, at + 4);
            if (magic != MAGIC_V1 && magic != MAGIC_V2) {
                return false;
            }
            int end = at + size;
            int sysFlag = intAt(b, at + 36);
            int bornAt = at + 48;
            int bornLength = (sysFlag & BORNHOST_V6_FLAG) != 0 ? 20 : 8;
            int storeAt = bornAt + bornLength + 8;
            int storeLength = (sysFlag & STOREHOST_V6_FLAG) != 0 ? 20 : 8;
            int tailAt = storeAt + storeLength;
            if (tailAt + 16 > end) {
                return false;
            }
            int bodyLength = intAt(b, tailAt + 12);
            int bodyAt = tailAt + 16;
            if (bodyLength < 0 || bodyLength > end - bodyAt) {
                return false;
            }
            int topicFieldAt = bodyAt + bodyLength;
            int topicField = magic == MAGIC_V1 ? 1 : 2;
            if (topicFieldAt + topicField > end) {
                return false;
            }
            int topicLength = magic == MAGIC_V1 ? b[topicFieldAt] : (short) SHORT.get(b, topicFieldAt);
            int topicAt = topicFieldAt + topicField;
            if (topicLength < 0 || topicLength > end - topicAt - 2) {
                return false;
            }
            int propertiesAt = topicAt + topicLength + 2;
            int propertiesLength = (short) SHORT.get(b, propertiesAt - 2);
            if (propertiesLength < 0 || propertiesAt + propertiesLength != end) {
                return false; // the size formula
            }
            long physicalOffset = longAt(b, at + 28);
            int queueId = intAt(b, at + 12);
            if (physicalOffset != startOffset + position || queueId < 0) {
                return false;
            }
            int bodyCrc = intAt(b, at + 8);
            if (checkCrc) {
                crc.reset();
                crc.update(b, bodyAt, bodyLength);
                if ((int) (crc.getValue() & 0x7FFFFFFFL) != bodyCrc) {
                    return false;
                }
            }
            HostTexts.Text born = bornHosts.of(b, bornAt, bornLength);
            HostTexts.Text store = storeHosts.of(b, storeAt, storeLength);
            if (born == null || store == null || !validTopic(b, topicAt, topicLength)
                    || Utf8.classify(b, propertiesAt, end) == Utf8.INVALID) {
                return false;
            }
            writer.row(b, at, size, magic, bodyCrc, queueId, physicalOffset, sysFlag, born, store, position + bodyAt,
                    bodyLength, topicAt, topicLength, propertiesAt, propertiesLength);
            rows++;
            return true;
        }
    }

    /** {@code topic_error} of the Python package: characters of [%|a-zA-Z0-9_-] only, at most 127 bytes, or 255
     * for a %RETRY% topic; not empty. */
    static boolean validTopic(byte[] b, int at, int length) {
        if (length == 0) {
            return false;
        }
        for (int i = at; i < at + length; i++) {
            if (!TOPIC_CHARS[b[i] & 0xFF]) {
                return false;
            }
        }
        if (length <= TOPIC_MAX_LENGTH) {
            return true;
        }
        return length <= RETRY_TOPIC_MAX_BYTES && length >= RETRY_PREFIX.length
                && Arrays.equals(b, at, at + RETRY_PREFIX.length, RETRY_PREFIX, 0, RETRY_PREFIX.length);
    }

    /** The table text and offsetMsgId prefix of each distinct host field, looked up by the field's bytes. */
    static final class HostTexts {
        /** A host field's text ({@code a.b.c.d:port}, {@code [v6]:port}) and msgId prefix, as UTF-8 bytes. */
        static final class Text {
            final byte[] text;
            final byte[] msgIdPrefix;

            Text(byte[] text, byte[] msgIdPrefix) {
                this.text = text;
                this.msgIdPrefix = msgIdPrefix;
            }
        }

        private static final Text REFUSED = new Text(null, null);
        private final Map<ByteBuffer, Text> seen = new HashMap<>();
        private long lastHead; // the last field's first 8 bytes, and for an IPv6 field the other 12
        private long lastMiddle;
        private int lastTail;
        private int lastLength;
        private Text lastText;

        /** The host in the field of {@code length} bytes (8 or 20) at {@code b[at]}; {@code null} when the
         * reference does not keep it (a port outside 0..65535, an IPv4-mapped address in an IPv6 field). A record's
         * host is most often the one before it: that is compared first. */
        Text of(byte[] b, int at, int length) {
            long head = longAt(b, at);
            long middle = length == 20 ? longAt(b, at + 8) : 0;
            int tail = length == 20 ? intAt(b, at + 16) : 0;
            if (lastText == null || length != lastLength || head != lastHead || middle != lastMiddle
                    || tail != lastTail) {
                ByteBuffer field = ByteBuffer.wrap(b, at, length).slice();
                Text text = seen.get(field);
                if (text == null) {
                    byte[] copy = Arrays.copyOfRange(b, at, at + length);
                    text = make(copy);
                    if (seen.size() < 65536) {
                        seen.put(ByteBuffer.wrap(copy), text);
                    }
                }
                lastHead = head;
                lastMiddle = middle;
                lastTail = tail;
                lastLength = length;
                lastText = text;
            }
            return lastText == REFUSED ? null : lastText;
        }

        private static Text make(byte[] field) {
            int addressLength = field.length - 4;
            int port = ((field[addressLength] & 0xFF) << 24) | ((field[addressLength + 1] & 0xFF) << 16)
                    | ((field[addressLength + 2] & 0xFF) << 8) | (field[addressLength + 3] & 0xFF);
            if (port < 0 || port > 65535) {
                return REFUSED;
            }
            byte[] address = Arrays.copyOf(field, addressLength);
            if (addressLength == 16 && Hosts.isIpv4Mapped(address)) {
                return REFUSED;
            }
            Hosts.Host host = new Hosts.Host(address, port);
            return new Text(host.text.getBytes(java.nio.charset.StandardCharsets.US_ASCII),
                    host.msgIdPrefix.getBytes(java.nio.charset.StandardCharsets.US_ASCII));
        }
    }

    /** The columns written ({@code DECODED} of the Python package, which owns them; the tests compare both). */
    static Schema schema() {
        return new Schema(List.of(
                SplitScratch.int64("physical_offset"), SplitScratch.int32("total_size"), SplitScratch.int32("magic"),
                SplitScratch.int32("body_crc"), SplitScratch.int32("queue_id"), SplitScratch.int32("flag"),
                SplitScratch.int64("queue_offset"), SplitScratch.int32("sys_flag"),
                SplitScratch.int64("born_timestamp"), SplitScratch.utf8("born_host"),
                SplitScratch.int64("store_timestamp"), SplitScratch.utf8("store_host"),
                SplitScratch.int32("reconsume_times"), SplitScratch.int64("prepared_transaction_offset"),
                SplitScratch.utf8("topic"), SplitScratch.propertiesMap("properties"),
                SplitScratch.utf8List("keys"), SplitScratch.utf8("tags"), SplitScratch.utf8("uniq_key"),
                SplitScratch.utf8("msg_id"), SplitScratch.binary("properties_bytes"), SplitScratch.int64("body_at"),
                SplitScratch.int32("body_length")));
    }

    private static final byte[] KEYS = {'K', 'E', 'Y', 'S'};
    private static final byte[] TAGS = {'T', 'A', 'G', 'S'};
    private static final byte[] UNIQ_KEY = {'U', 'N', 'I', 'Q', '_', 'K', 'E', 'Y'};
    private static final byte[] HEX = "0123456789ABCDEF".getBytes(java.nio.charset.StandardCharsets.US_ASCII);

    /** The rows, an Arrow IPC file of {@link #schema()} written a batch of {@link #BATCH_ROWS} rows at a time. */
    private static final class Writer implements AutoCloseable {
        private final ColumnBatches.Int64 physicalOffset = new ColumnBatches.Int64();
        private final ColumnBatches.Int32 totalSize = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 magic = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 bodyCrc = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 queueId = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 flag = new ColumnBatches.Int32();
        private final ColumnBatches.Int64 queueOffset = new ColumnBatches.Int64();
        private final ColumnBatches.Int32 sysFlag = new ColumnBatches.Int32();
        private final ColumnBatches.Int64 bornTimestamp = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes bornHost = new ColumnBatches.Bytes();
        private final ColumnBatches.Int64 storeTimestamp = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes storeHost = new ColumnBatches.Bytes();
        private final ColumnBatches.Int32 reconsumeTimes = new ColumnBatches.Int32();
        private final ColumnBatches.Int64 preparedTransactionOffset = new ColumnBatches.Int64();
        private final ColumnBatches.Int64 bodyAt = new ColumnBatches.Int64();
        private final ColumnBatches.Int32 bodyLength = new ColumnBatches.Int32();
        private final ColumnBatches.Bytes topicText = new ColumnBatches.Bytes();
        private final ColumnBatches.MapOf propertiesMap = new ColumnBatches.MapOf();
        private final ColumnBatches.ListOf keys = new ColumnBatches.ListOf();
        private final ColumnBatches.Bytes tags = new ColumnBatches.Bytes();
        private final ColumnBatches.Bytes uniqKey = new ColumnBatches.Bytes();
        private final ColumnBatches.Bytes msgIds = new ColumnBatches.Bytes();
        private final ColumnBatches.Bytes propertiesBytes = new ColumnBatches.Bytes();
        private final ColumnBatches batches;
        private final Properties parsed = new Properties();
        private final byte[] msgId = new byte[56];

        Writer(BufferAllocator allocator, String path) {
            batches = new ColumnBatches(allocator, schema(), Path.of(path), BATCH_ROWS, physicalOffset, totalSize,
                    magic, bodyCrc, queueId, flag, queueOffset, sysFlag, bornTimestamp, bornHost, storeTimestamp,
                    storeHost, reconsumeTimes, preparedTransactionOffset, topicText, propertiesMap, keys, tags,
                    uniqKey, msgIds, propertiesBytes, bodyAt, bodyLength);
        }

        void row(byte[] b, int at, int size, int magicCode, int crc, int queue, long offset, int flags,
                HostTexts.Text born, HostTexts.Text store, long bodyPosition, int bodySize, int topicAt, int topicLength,
                int propertiesAt, int propertiesLength) throws IOException {
            int storeTimestampAt = at + 48 + ((flags & BORNHOST_V6_FLAG) != 0 ? 20 : 8);
            int tailAt = storeTimestampAt + 8 + ((flags & STOREHOST_V6_FLAG) != 0 ? 20 : 8);
            physicalOffset.add(offset);
            totalSize.add(size);
            magic.add(magicCode);
            bodyCrc.add(crc);
            queueId.add(queue);
            flag.add(intAt(b, at + 16));
            queueOffset.add(longAt(b, at + 20));
            sysFlag.add(flags);
            bornTimestamp.add(longAt(b, at + 40));
            bornHost.add(born.text);
            storeTimestamp.add(longAt(b, storeTimestampAt));
            storeHost.add(store.text);
            reconsumeTimes.add(intAt(b, tailAt));
            preparedTransactionOffset.add(longAt(b, tailAt + 4));
            bodyAt.add(bodyPosition); // the body stays in the file: Python points at it there
            bodyLength.add(bodySize);
            topicText.add(b, topicAt, topicLength);
            int propertiesEnd = propertiesAt + propertiesLength;
            parsed.parse(b, propertiesAt, propertiesEnd);
            for (int j = 0; j < parsed.count; j++) {
                propertiesMap.keys.add(b, parsed.nameAt[j], parsed.nameLength[j]);
                propertiesMap.values.add(b, parsed.valueAt[j], parsed.valueLength[j]);
            }
            propertiesMap.end();
            if (parsed.keys >= 0) { // KEYS split on single spaces, empty tokens dropped
                int from = parsed.valueAt[parsed.keys];
                int stop = from + parsed.valueLength[parsed.keys];
                for (int j = from; j <= stop; j++) {
                    if (j == stop || b[j] == ' ') {
                        if (j > from) {
                            keys.elements.add(b, from, j - from);
                        }
                        from = j + 1;
                    }
                }
            }
            keys.end();
            value(tags, b, parsed.tags);
            value(uniqKey, b, parsed.uniqKey);
            int prefix = store.msgIdPrefix.length;
            System.arraycopy(store.msgIdPrefix, 0, msgId, 0, prefix);
            for (int d = 0; d < 16; d++) {
                msgId[prefix + d] = HEX[(int) (offset >>> (60 - 4 * d)) & 0xF];
            }
            msgIds.add(msgId, 0, prefix + 16);
            propertiesBytes.add(b, propertiesAt, propertiesLength);
            batches.row();
        }

        private void value(ColumnBatches.Bytes column, byte[] properties, int entry) {
            if (entry < 0) {
                column.addNull();
            } else {
                column.add(properties, parsed.valueAt[entry], parsed.valueLength[entry]);
            }
        }

        @Override
        public void close() throws IOException {
            batches.close();
        }
    }

    /**
     * A properties string's pairs as {@code parse_properties} gives them: split on 0x02, a segment's first 0x01
     * parts its name from its value, a segment without one or with an empty name or value is dropped, a repeated
     * name keeps its first place and takes its last value. On the UTF-8 bytes: 0x01 and 0x02 are never part of a
     * multi-byte character, and a kept segment has at least three characters, so nothing the character rules
     * drop is kept here.
     */
    static final class Properties {
        int count;
        /** The entries of KEYS, TAGS and UNIQ_KEY, or -1. */
        int keys;
        int tags;
        int uniqKey;
        int[] nameAt = new int[16];
        int[] nameLength = new int[16];
        int[] valueAt = new int[16];
        int[] valueLength = new int[16];
        /** Name hashes to entries, for strings with many names (a linear search would be quadratic). */
        private int[] table = new int[0];
        private static final int LINEAR = 16;

        /** Parses {@code bytes[from, end)}; the entries' places are in {@code bytes}. */
        void parse(byte[] bytes, int from, int end) {
            count = 0;
            keys = tags = uniqKey = -1;
            int segment = from;
            int separator = -1; // the segment's first 0x01
            for (int i = from; i < end; i++) {
                byte b = bytes[i];
                if (b == 2) {
                    segmentEnds(bytes, segment, separator, i);
                    segment = i + 1;
                    separator = -1;
                } else if (b == 1 && separator < 0) {
                    separator = i;
                }
            }
            segmentEnds(bytes, segment, separator, end);
        }

        private void segmentEnds(byte[] bytes, int segment, int separator, int end) {
            if (separator > segment && separator < end - 1) {
                add(bytes, segment, separator - segment, separator + 1, end - separator - 1);
            }
        }

        private void add(byte[] bytes, int at, int length, int value, int valueLen) {
            int existing = lookup(bytes, at, length);
            if (existing >= 0) {
                valueAt[existing] = value;
                valueLength[existing] = valueLen;
                return;
            }
            if (named(bytes, at, length, KEYS)) {
                keys = count;
            } else if (named(bytes, at, length, TAGS)) {
                tags = count;
            } else if (named(bytes, at, length, UNIQ_KEY)) {
                uniqKey = count;
            }
            if (count == nameAt.length) {
                int grown = 2 * count;
                nameAt = Arrays.copyOf(nameAt, grown);
                nameLength = Arrays.copyOf(nameLength, grown);
                valueAt = Arrays.copyOf(valueAt, grown);
                valueLength = Arrays.copyOf(valueLength, grown);
            }
            nameAt[count] = at;
            nameLength[count] = length;
            valueAt[count] = value;
            valueLength[count] = valueLen;
            count++;
            if (count == LINEAR) {
                rehash(bytes, 4 * LINEAR);
            } else if (count > LINEAR) {
                if (2 * count > table.length) {
                    rehash(bytes, 2 * table.length);
                } else {
                    insert(bytes, count - 1);
                }
            }
        }

        /** The entry named {@code bytes[at, at + length)}, or -1. */
        private int lookup(byte[] bytes, int at, int length) {
            if (count < LINEAR) {
                for (int e = 0; e < count; e++) {
                    if (nameLength[e] == length && bytes[nameAt[e]] == bytes[at]
                            && Arrays.equals(bytes, nameAt[e], nameAt[e] + length, bytes, at, at + length)) {
                        return e;
                    }
                }
                return -1;
            }
            int mask = table.length - 1;
            for (int slot = hash(bytes, at, length) & mask; table[slot] != 0; slot = (slot + 1) & mask) {
                int e = table[slot] - 1;
                if (nameLength[e] == length && Arrays.equals(bytes, nameAt[e], nameAt[e] + length, bytes, at, at + length)) {
                    return e;
                }
            }
            return -1;
        }

        private static boolean named(byte[] bytes, int at, int length, byte[] name) {
            return length == name.length && Arrays.equals(bytes, at, at + length, name, 0, length);
        }

        private void rehash(byte[] bytes, int size) {
            table = new int[size];
            for (int e = 0; e < count; e++) {
                insert(bytes, e);
            }
        }

        private void insert(byte[] bytes, int e) {
            int mask = table.length - 1;
            int slot = hash(bytes, nameAt[e], nameLength[e]) & mask;
            while (table[slot] != 0) {
                slot = (slot + 1) & mask;
            }
            table[slot] = e + 1;
        }

        private static int hash(byte[] bytes, int at, int length) {
            int h = 0;
            for (int i = at; i < at + length; i++) {
                h = 31 * h + bytes[i];
            }
            return h ^ (h >>> 16);
        }

    }

    /** {@code java rmqlake.jvm.StoreRecords}: reads decode tasks from stdin, a line each as {@link #run} takes them,
     * and prints {@link #run}'s answer line for each (the tests hold the decoder to the Python reader with it). */
    public static void main(String[] args) throws IOException {
        java.io.BufferedReader in = new java.io.BufferedReader(
                new java.io.InputStreamReader(System.in, java.nio.charset.StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            System.out.println(decodeTask(line));
            System.out.flush();
        }
    }
}
