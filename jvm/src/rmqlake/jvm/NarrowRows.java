package rmqlake.jvm;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.channels.Channels;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.TinyIntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileWriter;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * The narrow rows of a split's accepted messages (what ordering and placing need), written as the split's narrow
 * file: Arrow IPC in {@code NARROW_SCHEMA} of {@code rmqlake.ingest.scratch}, which owns it (the tests read both
 * routes' files with it), sorted by the append order, in batches of {@link #BATCH_ROWS} rows, with each batch's
 * store-time span in the footer ({@link #SPANS_KEY}).
 *
 * <p>Every row is an input message of one file ({@code kind} 0, {@code origin_timestamp} its store time): within a
 * split the append order is store time, then line. Lines the JVM accepts are never delayed, so no row has a due
 * time, a delay level or a parent. A message sent without a queue takes a turn of its own topic, a transactional
 * half sent without one a turn of its real topic (its REAL_QID).
 */
final class NarrowRows {
    /** {@code NARROW_BATCH_ROWS} of the Python package: the unit the ordering step reads. */
    static final int BATCH_ROWS = 8192;
    /** {@code NARROW_SPANS_KEY} of the Python package: per batch, its first and last store times and its rows. */
    static final String SPANS_KEY = "rmqlake.store_time_spans";
    private static final int NO_QUEUE = Integer.MIN_VALUE;
    static final Schema SCHEMA = new Schema(List.of(
            integer("split", 32), integer("file_rank", 32), integer("source_line", 64), integer("store_timestamp", 64),
            text("topic"), integer("queue_id", 32), integer("sys_flag", 32), integer("total_size", 32),
            integer("scratch_batch", 32), integer("scratch_row", 32), integer("kind", 8),
            integer("origin_timestamp", 64), text("rr_topic"), integer("due", 64), integer("level", 32),
            integer("origin_partition", 32), integer("origin_turn", 64), integer("parent_timestamp", 64),
            integer("parent_rank", 32), integer("parent_line", 64)));

    private static Field integer(String name, int bits) {
        return new Field(name, FieldType.nullable(new ArrowType.Int(bits, true)), null);
    }

    private static Field text(String name) {
        return new Field(name, FieldType.nullable(ArrowType.Utf8.INSTANCE), null);
    }

    private final int split;
    private final int fileRank;
    private int count;
    private long[] sourceLines = new long[1024];
    private long[] storeTimestamps = new long[1024];
    private byte[][] topics = new byte[1024][];
    private byte[][] turnTopics = new byte[1024][]; // null: the message takes no round-robin turn
    private int[] queueIds = new int[1024];
    private int[] sysFlags = new int[1024];
    private int[] totalSizes = new int[1024];
    private final Map<String, byte[]> topicBytes = new HashMap<>();

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
            turnTopics = Arrays.copyOf(turnTopics, grown);
            queueIds = Arrays.copyOf(queueIds, grown);
            sysFlags = Arrays.copyOf(sysFlags, grown);
            totalSizes = Arrays.copyOf(totalSizes, grown);
        }
        sourceLines[count] = sourceLine;
        storeTimestamps[count] = message.storeTimestamp;
        topics[count] = utf8(message.topic);
        // a message sent without a queue takes a turn of its topic; a half sent without one, of its real topic
        turnTopics[count] = message.queueId == null ? topics[count]
                : Boolean.TRUE.equals(message.realQueueRoundRobin) ? utf8(message.realTopic) : null;
        queueIds[count] = message.queueId == null ? NO_QUEUE : message.queueId;
        sysFlags[count] = message.sysFlag;
        totalSizes[count] = message.totalSize;
        count++;
    }

    private byte[] utf8(String topic) {
        return topicBytes.computeIfAbsent(topic, name -> name.getBytes(StandardCharsets.UTF_8));
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

    /** The rows in the append order as an Arrow IPC file at {@code path}. */
    void write(Path path) throws IOException {
        int[] order = appendOrder();
        StringBuilder spans = new StringBuilder("[");
        for (int first = 0; first < count; first += BATCH_ROWS) {
            int last = Math.min(first + BATCH_ROWS, count) - 1;
            spans.append(first == 0 ? "[" : ",[").append(storeTimestamps[order[first]]).append(',')
                    .append(storeTimestamps[order[last]]).append(',').append(last - first + 1).append(']');
        }
        spans.append(']');
        try (BufferAllocator allocator = new RootAllocator();
                VectorSchemaRoot root = VectorSchemaRoot.create(SCHEMA, allocator);
                OutputStream out = new BufferedOutputStream(Files.newOutputStream(path), 1 << 20);
                ArrowFileWriter writer = new ArrowFileWriter(
                        root, null, Channels.newChannel(out), Map.of(SPANS_KEY, spans.toString()))) {
            FieldVector[] v = root.getFieldVectors().toArray(new FieldVector[0]);
            for (FieldVector vector : v) {
                vector.setInitialCapacity(Math.min(count, BATCH_ROWS));
            }
            root.allocateNew();
            writer.start();
            for (int first = 0; first < count; first += BATCH_ROWS) {
                int rows = Math.min(BATCH_ROWS, count - first);
                for (int j = 0; j < rows; j++) {
                    batchRow(v, j, order[first + j]);
                }
                root.setRowCount(rows); // the columns not set (due, level, origin_*, parent_*) are null
                writer.writeBatch();
                for (FieldVector vector : v) {
                    vector.reset();
                }
            }
            writer.end();
        }
    }

    /** Row {@code i} of the arrays as row {@code j} of the batch's vectors (a null field is not set). */
    private void batchRow(FieldVector[] v, int j, int i) {
        ((IntVector) v[0]).setSafe(j, split);
        ((IntVector) v[1]).setSafe(j, fileRank);
        ((BigIntVector) v[2]).setSafe(j, sourceLines[i]);
        ((BigIntVector) v[3]).setSafe(j, storeTimestamps[i]);
        ((VarCharVector) v[4]).setSafe(j, topics[i]);
        boolean noQueue = queueIds[i] == NO_QUEUE;
        if (!noQueue) {
            ((IntVector) v[5]).setSafe(j, queueIds[i]);
        }
        ((IntVector) v[6]).setSafe(j, sysFlags[i]);
        ((IntVector) v[7]).setSafe(j, totalSizes[i]);
        ((IntVector) v[8]).setSafe(j, i / SplitScratch.BATCH_ROWS);
        ((IntVector) v[9]).setSafe(j, i % SplitScratch.BATCH_ROWS);
        ((TinyIntVector) v[10]).setSafe(j, 0);
        ((BigIntVector) v[11]).setSafe(j, storeTimestamps[i]);
        if (turnTopics[i] != null) {
            ((VarCharVector) v[12]).setSafe(j, turnTopics[i]);
        } else {
            ((VarCharVector) v[12]).setNull(j);
        }
    }
}
