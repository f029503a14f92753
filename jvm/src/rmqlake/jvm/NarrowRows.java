package rmqlake.jvm;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.api.WriteSupport;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.io.LocalOutputFile;
import org.apache.parquet.io.OutputFile;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.io.api.RecordConsumer;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;

/**
 * The narrow rows of a split's accepted messages (what ordering and placing need), written as the split's narrow
 * Parquet file: {@code NARROW_SCHEMA} of {@code rmqlake.ingest.scratch}, which owns it (the tests read both
 * routes' files with it), sorted by the append order, in row groups of {@link #ROW_GROUP_ROWS} rows.
 *
 * <p>Every row is an input message of one file ({@code kind} 0, {@code origin_timestamp} its store time): within a
 * split the append order is store time, then line. Lines the JVM accepts are never re-routed, so no row has a due
 * time, a delay level or a parent, and a message sent without a queue takes a turn of its own topic.
 */
final class NarrowRows {
    /** {@code NARROW_ROW_GROUP_ROWS} of the Python package: the unit the ordering step reads. */
    static final int ROW_GROUP_ROWS = 8192;
    private static final int NO_QUEUE = Integer.MIN_VALUE;
    static final MessageType SCHEMA = MessageTypeParser.parseMessageType(String.join("\n",
            "message narrow {",
            "  optional int32 split;",
            "  optional int32 file_rank;",
            "  optional int64 source_line;",
            "  optional int64 store_timestamp;",
            "  optional binary topic (STRING);",
            "  optional int32 queue_id;",
            "  optional int32 sys_flag;",
            "  optional int32 total_size;",
            "  optional int32 scratch_batch;",
            "  optional int32 scratch_row;",
            "  optional int32 kind (INTEGER(8,true));",
            "  optional int64 origin_timestamp;",
            "  optional binary rr_topic (STRING);",
            "  optional int64 due;",
            "  optional int32 level;",
            "  optional int32 origin_partition;",
            "  optional int64 origin_turn;",
            "  optional int64 parent_timestamp;",
            "  optional int32 parent_rank;",
            "  optional int64 parent_line;",
            "}"));

    private final int split;
    private final int fileRank;
    private int count;
    private long[] sourceLines = new long[1024];
    private long[] storeTimestamps = new long[1024];
    private Binary[] topics = new Binary[1024];
    private int[] queueIds = new int[1024];
    private int[] sysFlags = new int[1024];
    private int[] totalSizes = new int[1024];
    private final Map<String, Binary> topicBytes = new HashMap<>();

    NarrowRows(int split, int fileRank) {
        this.split = split;
        this.fileRank = fileRank;
    }

    int size() {
        return count;
    }

    void add(long sourceLine, CommonLineParser.Parsed message) {
        if (count == sourceLines.length) {
            int grown = count * 2;
            sourceLines = Arrays.copyOf(sourceLines, grown);
            storeTimestamps = Arrays.copyOf(storeTimestamps, grown);
            topics = Arrays.copyOf(topics, grown);
            queueIds = Arrays.copyOf(queueIds, grown);
            sysFlags = Arrays.copyOf(sysFlags, grown);
            totalSizes = Arrays.copyOf(totalSizes, grown);
        }
        sourceLines[count] = sourceLine;
        storeTimestamps[count] = message.storeTimestamp;
        topics[count] = topicBytes.computeIfAbsent(
                message.topic, topic -> Binary.fromConstantByteArray(topic.getBytes(StandardCharsets.UTF_8)));
        queueIds[count] = message.queueId == null ? NO_QUEUE : message.queueId;
        sysFlags[count] = message.sysFlag;
        totalSizes[count] = message.totalSize;
        count++;
    }

    /** The latest store time of the rows ({@code Long.MIN_VALUE}: no rows). */
    long lastStoreTimestamp() {
        long latest = Long.MIN_VALUE;
        for (int i = 0; i < count; i++) {
            latest = Math.max(latest, storeTimestamps[i]);
        }
        return latest;
    }

    /** The rows in the append order: store time, then line (rows were added in line order: a stable sort). */
    int[] appendOrder() {
        Integer[] order = new Integer[count];
        for (int i = 0; i < count; i++) {
            order[i] = i;
        }
        Arrays.sort(order, (a, b) -> Long.compare(storeTimestamps[a], storeTimestamps[b])); // stable (TimSort)
        int[] rows = new int[count];
        for (int i = 0; i < count; i++) {
            rows[i] = order[i];
        }
        return rows;
    }

    void write(Path path) throws IOException {
        try (ParquetWriter<Integer> writer = new Builder(new LocalOutputFile(path), this)
                .withCompressionCodec(CompressionCodecName.UNCOMPRESSED)
                .withRowGroupRowCountLimit(ROW_GROUP_ROWS)
                .withStatisticsEnabled(false)
                .withStatisticsEnabled("store_timestamp", true)
                // numbers are written plain (dictionaries of mostly distinct values cost time and save nothing)
                .withDictionaryEncoding(false)
                .withDictionaryEncoding("topic", true)
                .withDictionaryEncoding("rr_topic", true)
                .build()) {
            for (int row : appendOrder()) {
                writer.write(row);
            }
        }
    }

    private static final class Builder extends ParquetWriter.Builder<Integer, Builder> {
        private final NarrowRows rows;

        Builder(OutputFile file, NarrowRows rows) {
            super(file);
            this.rows = rows;
        }

        @Override
        protected Builder self() {
            return this;
        }

        @Override
        protected WriteSupport<Integer> getWriteSupport(Configuration conf) {
            return new RowWriter(rows);
        }
    }

    /** Writes row i of the arrays, field by field (a null field is not written). */
    private static final class RowWriter extends WriteSupport<Integer> {
        private final NarrowRows rows;
        private RecordConsumer out;

        RowWriter(NarrowRows rows) {
            this.rows = rows;
        }

        @Override
        public WriteContext init(Configuration configuration) {
            return new WriteContext(SCHEMA, Map.of());
        }

        @Override
        public void prepareForWrite(RecordConsumer recordConsumer) {
            out = recordConsumer;
        }

        @Override
        public void write(Integer boxed) {
            int i = boxed;
            NarrowRows r = rows;
            out.startMessage();
            integer(0, "split", r.split);
            integer(1, "file_rank", r.fileRank);
            bigint(2, "source_line", r.sourceLines[i]);
            bigint(3, "store_timestamp", r.storeTimestamps[i]);
            text(4, "topic", r.topics[i]);
            boolean noQueue = r.queueIds[i] == NO_QUEUE;
            if (!noQueue) {
                integer(5, "queue_id", r.queueIds[i]);
            }
            integer(6, "sys_flag", r.sysFlags[i]);
            integer(7, "total_size", r.totalSizes[i]);
            integer(8, "scratch_batch", i / SplitScratch.BATCH_ROWS);
            integer(9, "scratch_row", i % SplitScratch.BATCH_ROWS);
            integer(10, "kind", 0);
            bigint(11, "origin_timestamp", r.storeTimestamps[i]);
            if (noQueue) {
                text(12, "rr_topic", r.topics[i]); // a round-robin turn of its own topic
            }
            out.endMessage(); // due, level, origin_* and parent_* are null
        }

        private void integer(int index, String name, int value) {
            out.startField(name, index);
            out.addInteger(value);
            out.endField(name, index);
        }

        private void bigint(int index, String name, long value) {
            out.startField(name, index);
            out.addLong(value);
            out.endField(name, index);
        }

        private void text(int index, String name, Binary value) {
            out.startField(name, index);
            out.addBinary(value);
            out.endField(name, index);
        }
    }
}
