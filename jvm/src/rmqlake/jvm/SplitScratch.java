package rmqlake.jvm;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * One input split through {@link CommonLineParser}: the messages it accepts go to an Arrow IPC file in the
 * scratch schema of the ingest (a source line and the message fields), the lines it leaves undecided (their
 * numbers and bytes) to a second one, for the per-line parser.
 *
 * <p>The lines of a split are those starting inside it, as the Python reader takes them: a split that does not
 * start its file skips the line crossing its start; the last line is read to its end past the split's end; a
 * UTF-8 byte order mark at the start of the file is skipped; a carriage return ending a line is dropped.
 */
public final class SplitScratch {
    static final int BATCH_ROWS = 2048;
    private static final int READ_BYTES = 8 << 20;
    /** A line at least this long is not read into memory: the split is given back to the Python route. No message
     * of the broker's 4 MiB limit has such a line, even base64-encoded or escaped character by character. */
    static final int MAX_LINE_BYTES = 64 << 20;
    private static final byte[] BOM = {(byte) 0xEF, (byte) 0xBB, (byte) 0xBF};
    private static final VarHandle WORDS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long ONES = 0x0101010101010101L;
    private static final long HIGHS = 0x8080808080808080L;
    private static final long NEWLINES = ONES * '\n';

    private SplitScratch() {}

    /** Lines, accepted messages, undecided lines and accepted halves (transactional) of the split. */
    public static long[] parse(
            String path, long start, long end, long firstLine, int fileHash32, CommonLineParser.Options options,
            String messagesPath, String undecidedPath) throws IOException {
        return parse(path, start, end, firstLine, fileHash32, options, messagesPath, undecidedPath, null);
    }

    /** As above; each accepted message also gets its narrow row in {@code narrow} (unless null), in the order of
     * the messages file (row i is in batch i / {@link #BATCH_ROWS}, at i % {@link #BATCH_ROWS}). */
    static long[] parse(
            String path, long start, long end, long firstLine, int fileHash32, CommonLineParser.Options options,
            String messagesPath, String undecidedPath, NarrowRows narrow) throws IOException {
        CommonLineParser parser = new CommonLineParser(options);
        try (BufferAllocator allocator = new RootAllocator();
                Messages messages = new Messages(allocator, messagesPath);
                Undecided undecided = new Undecided(allocator, undecidedPath);
                FileChannel channel = FileChannel.open(Paths.get(path), StandardOpenOption.READ)) {
            long[] counts = new long[4];
            long number = firstLine;
            Lines lines = new Lines(channel, start, end);
            while (lines.next()) {
                CommonLineParser.Parsed parsed = parser.parse(lines.buffer, lines.lineStart, lines.lineEnd, number, fileHash32);
                if (parsed != null) {
                    messages.message(number, parsed);
                    if (narrow != null) {
                        narrow.add(number, parsed);
                    }
                    counts[1]++;
                    if (parsed.realTopic != null) {
                        counts[3]++; // a half
                    }
                } else {
                    undecided.line(number, lines.buffer, lines.lineStart, lines.lineEnd);
                    counts[2]++;
                }
                number++;
                counts[0]++;
            }
            return counts;
        }
    }

    /** A line too long to hold ({@link #MAX_LINE_BYTES}). */
    static final class LineTooLong extends RuntimeException {
        LineTooLong(String message) {
            super(message);
        }
    }

    /** The lines starting in [start, end) of a file, one at a time, in a buffer read a block at a time. */
    private static final class Lines {
        private final FileChannel channel;
        private final long end;
        byte[] buffer = new byte[READ_BYTES];
        private int filled;
        private long bufferPosition; // the file offset of buffer[0]
        private int at; // the next line's start in the buffer
        private boolean eof;
        private boolean afterBom; // the first line starts past a byte order mark: in the split as if at 0
        int lineStart;
        int lineEnd;

        Lines(FileChannel channel, long start, long end) throws IOException {
            this.channel = channel;
            this.end = end;
            bufferPosition = Math.max(start - 1, 0);
            fill();
            if (start > 0) {
                int newline = find(0);
                while (newline < 0 && !eof) {
                    at = filled; // no line starts before the newline: drop what is read
                    fill();
                    newline = find(at);
                }
                at = newline < 0 ? filled : newline + 1;
            } else if (filled >= 3 && buffer[0] == BOM[0] && buffer[1] == BOM[1] && buffer[2] == BOM[2]) {
                at = 3;
                afterBom = true;
            }
        }

        boolean next() throws IOException {
            while (true) {
                long lineAt = afterBom ? 0 : bufferPosition + at;
                if (lineAt >= end || (at >= filled && eof)) {
                    return false;
                }
                int newline = find(at);
                if (newline >= 0 || eof) {
                    int stop = newline >= 0 ? newline : filled;
                    lineStart = at;
                    lineEnd = stop > at && buffer[stop - 1] == '\r' ? stop - 1 : stop;
                    at = newline >= 0 ? newline + 1 : filled;
                    afterBom = false;
                    return true;
                }
                fill(); // the line goes on past the buffer
            }
        }

        /** The first newline in the buffer from {@code from}, or -1; eight bytes at a time (the "has a zero byte"
         * test, which a borrow can only make say yes where a byte is a newline). */
        private int find(int from) {
            int i = from;
            while (i + 8 <= filled) {
                long newlines = (long) WORDS.get(buffer, i) ^ NEWLINES;
                if (((newlines - ONES) & ~newlines & HIGHS) != 0) {
                    break;
                }
                i += 8;
            }
            for (; i < filled; i++) {
                if (buffer[i] == '\n') {
                    return i;
                }
            }
            return -1;
        }

        /** Keeps the buffer from {@code at} on, and reads more after it (a bigger buffer when a line fills it). */
        private void fill() throws IOException {
            if (at > 0) {
                System.arraycopy(buffer, at, buffer, 0, filled - at);
                filled -= at;
                bufferPosition += at;
                at = 0;
            }
            if (filled == buffer.length) {
                if (buffer.length >= MAX_LINE_BYTES) {
                    throw new LineTooLong("the line starting at byte " + bufferPosition + " is longer than "
                            + (MAX_LINE_BYTES >> 20) + " MiB");
                }
                buffer = Arrays.copyOf(buffer, buffer.length * 2);
            }
            ByteBuffer target = ByteBuffer.wrap(buffer, filled, buffer.length - filled);
            int read = channel.read(target, bufferPosition + filled);
            if (read < 0) {
                eof = true;
            } else {
                filled += read;
                eof = bufferPosition + filled >= channel.size();
            }
        }
    }

    /** The ingest's scratch schema ({@code SCRATCH_COLUMNS} of {@code rmqlake.ingest.scratch}, which owns it; the
     * tests compare the two). */
    static Schema messagesSchema() {
        return new Schema(List.of(
                int64("source_line"), utf8("topic"), int32("queue_id"), int32("flag"), int32("sys_flag"), int32("magic"),
                int64("born_timestamp"), utf8("born_host"), int64("store_timestamp"), utf8("store_host"),
                utf8("store_host_prefix"), int32("reconsume_times"), int64("prepared_transaction_offset"), binary("body"),
                int32("body_crc"), propertiesMap("properties"), binary("properties_bytes"), utf8List("keys"),
                utf8("tags"), utf8("uniq_key"), int32("total_size"),
                new Field("real_queue_round_robin", FieldType.nullable(ArrowType.Bool.INSTANCE), null)));
    }

    /** The commitlog's properties column: map<string, string> as pyarrow types it (keys not null). */
    static Field propertiesMap(String name) {
        Field entries = new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE),
                List.of(new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null), utf8("value")));
        return new Field(name, FieldType.nullable(new ArrowType.Map(false)), List.of(entries));
    }

    /** A list<string> column, as pyarrow types it (elements named "element"). */
    static Field utf8List(String name) {
        return new Field(name, FieldType.nullable(ArrowType.List.INSTANCE), List.of(utf8("element")));
    }

    static Schema undecidedSchema() {
        return new Schema(List.of(int64("source_line"), binary("raw")));
    }

    static Field int64(String name) {
        return new Field(name, FieldType.nullable(new ArrowType.Int(64, true)), null);
    }

    static Field int32(String name) {
        return new Field(name, FieldType.nullable(new ArrowType.Int(32, true)), null);
    }

    static Field utf8(String name) {
        return new Field(name, FieldType.nullable(ArrowType.Utf8.INSTANCE), null);
    }

    static Field binary(String name) {
        return new Field(name, FieldType.nullable(ArrowType.Binary.INSTANCE), null);
    }

    /** The scratch file of a split's messages, written a batch of {@link #BATCH_ROWS} rows at a time. */
    private static final class Messages implements AutoCloseable {
        private final ColumnBatches.Int64 sourceLine = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes topic = new ColumnBatches.Bytes();
        private final ColumnBatches.Int32 queueId = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 flag = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 sysFlag = new ColumnBatches.Int32();
        private final ColumnBatches.Int32 magic = new ColumnBatches.Int32();
        private final ColumnBatches.Int64 bornTimestamp = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes bornHost = new ColumnBatches.Bytes();
        private final ColumnBatches.Int64 storeTimestamp = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes storeHost = new ColumnBatches.Bytes();
        private final ColumnBatches.Bytes storeHostPrefix = new ColumnBatches.Bytes();
        private final ColumnBatches.Int32 reconsumeTimes = new ColumnBatches.Int32();
        private final ColumnBatches.Int64 preparedTransactionOffset = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes body = new ColumnBatches.Bytes(BATCH_ROWS * 1024);
        private final ColumnBatches.Int32 bodyCrc = new ColumnBatches.Int32();
        private final ColumnBatches.MapOf properties = new ColumnBatches.MapOf();
        private final ColumnBatches.Bytes propertiesBytes = new ColumnBatches.Bytes();
        private final ColumnBatches.ListOf keys = new ColumnBatches.ListOf();
        private final ColumnBatches.Bytes tags = new ColumnBatches.Bytes();
        private final ColumnBatches.Bytes uniqKey = new ColumnBatches.Bytes();
        private final ColumnBatches.Int32 totalSize = new ColumnBatches.Int32();
        private final ColumnBatches.Bool realQueueRoundRobin = new ColumnBatches.Bool();
        private final ColumnBatches batches;
        private final Utf8Cache utf8 = new Utf8Cache();

        Messages(BufferAllocator allocator, String path) {
            batches = new ColumnBatches(allocator, messagesSchema(), Path.of(path), BATCH_ROWS, sourceLine, topic,
                    queueId, flag, sysFlag, magic, bornTimestamp, bornHost, storeTimestamp, storeHost,
                    storeHostPrefix, reconsumeTimes, preparedTransactionOffset, body, bodyCrc, properties,
                    propertiesBytes, keys, tags, uniqKey, totalSize, realQueueRoundRobin);
        }

        void message(long number, CommonLineParser.Parsed m) throws IOException {
            sourceLine.add(number);
            utf8.add(topic, m.topic, true);
            if (m.queueId != null) {
                queueId.add(m.queueId);
            } else {
                queueId.addNull();
            }
            flag.add(m.flag);
            sysFlag.add(m.sysFlag);
            magic.add(m.magic);
            bornTimestamp.add(m.bornTimestamp);
            utf8.add(bornHost, m.bornHost, true);
            storeTimestamp.add(m.storeTimestamp);
            utf8.add(storeHost, m.storeHost, true);
            utf8.add(storeHostPrefix, m.storeHostPrefix, true);
            reconsumeTimes.add(m.reconsumeTimes);
            preparedTransactionOffset.add(m.preparedTransactionOffset);
            body.add(m.bodyBytes, m.bodyOffset, m.bodyLength);
            bodyCrc.add(m.bodyCrc);
            for (String[] pair : m.properties) {
                utf8.add(properties.keys, pair[0], true);
                utf8.add(properties.values, pair[1], false);
            }
            properties.end();
            propertiesBytes.add(m.propertiesBytes);
            for (String key : m.keys) {
                utf8.add(keys.elements, key, false);
            }
            keys.end();
            utf8.add(tags, m.tags, true);
            utf8.add(uniqKey, m.uniqKey, false);
            totalSize.add(m.totalSize);
            if (m.realQueueRoundRobin != null) {
                realQueueRoundRobin.add(m.realQueueRoundRobin);
            } else {
                realQueueRoundRobin.addNull(); // stored on its own topic
            }
            batches.row();
        }

        @Override
        public void close() throws IOException {
            batches.close();
        }
    }

    /** The file of the lines a split leaves to the per-line parser: their numbers and bytes. */
    private static final class Undecided implements AutoCloseable {
        private final ColumnBatches.Int64 sourceLine = new ColumnBatches.Int64();
        private final ColumnBatches.Bytes raw = new ColumnBatches.Bytes();
        private final ColumnBatches batches;

        Undecided(BufferAllocator allocator, String path) {
            batches = new ColumnBatches(allocator, undecidedSchema(), Path.of(path), BATCH_ROWS, sourceLine, raw);
        }

        void line(long number, byte[] line, int start, int end) throws IOException {
            sourceLine.add(number);
            raw.add(line, start, end - start);
            batches.row();
        }

        @Override
        public void close() throws IOException {
            batches.close();
        }
    }

    /** The UTF-8 bytes of texts, those that repeat (topics, hosts, names) kept. */
    private static final class Utf8Cache {
        private final Map<String, byte[]> kept = new HashMap<>();

        void add(ColumnBatches.Bytes column, String value, boolean repeats) {
            if (value == null) {
                column.addNull();
                return;
            }
            byte[] bytes = repeats ? kept.get(value) : null;
            if (bytes == null) {
                bytes = value.getBytes(StandardCharsets.UTF_8);
                if (repeats && kept.size() < 4096) {
                    kept.put(value, bytes);
                }
            }
            column.add(bytes);
        }
    }

    /** {@code java rmqlake.jvm.SplitScratch OPTIONS PATH START END FIRST_LINE HASH32 MESSAGES UNDECIDED}: prints the
     * counts (lines, accepted, undecided). */
    public static void main(String[] args) throws IOException {
        CommonLineParser.Options options = ParseLinesTool.readOptions(Files.readAllLines(Paths.get(args[0]), StandardCharsets.UTF_8));
        long[] counts = parse(args[1], Long.parseLong(args[2]), Long.parseLong(args[3]), Long.parseLong(args[4]),
                (int) Long.parseLong(args[5]), options, args[6], args[7]);
        System.out.println(counts[0] + " " + counts[1] + " " + counts[2]);
    }
}
