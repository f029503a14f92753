package rmqlake.jvm;

import java.io.IOException;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileWriter;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * Arrow record batches built column by column in plain Java arrays and written to an Arrow IPC file a batch at a
 * time. A value costs a store into an array; each of Arrow's vector calls checks bounds and reference counts, which
 * made building the rows cost more than decoding the records they come from.
 *
 * <p>Rows are appended in order: every column gets one value (or null) per row, then {@link #row()}. The columns
 * are given in the order of the schema's fields; each lays out its buffers as the Arrow format does (validity
 * bitmap, then offsets and data; children after their parent).
 */
final class ColumnBatches implements AutoCloseable {
    private final BufferAllocator allocator;
    private final Schema schema;
    private final Path path;
    private final Column[] columns;
    private final int batchRows;
    private VectorSchemaRoot empty;
    private Writer writer;
    private int rows;

    /** A file of {@code schema} at {@code path}. */
    ColumnBatches(BufferAllocator allocator, Schema schema, Path path, int batchRows, Column... columns) {
        this.allocator = allocator;
        this.schema = schema;
        this.path = path;
        this.batchRows = batchRows;
        this.columns = columns;
    }

    /** Ends the row whose values were just given; writes the batch when it is full. */
    void row() throws IOException {
        if (++rows == batchRows) {
            flush();
        }
    }

    private void flush() throws IOException {
        if (rows == 0) {
            return;
        }
        open();
        List<ArrowFieldNode> nodes = new ArrayList<>();
        List<ArrowBuf> buffers = new ArrayList<>();
        try {
            for (Column column : columns) {
                column.unload(nodes, buffers, allocator);
            }
            try (ArrowRecordBatch batch = new ArrowRecordBatch(rows, nodes, buffers)) {
                writer.write(batch);
            }
        } finally {
            for (ArrowBuf buffer : buffers) {
                buffer.getReferenceManager().release();
            }
        }
        for (Column column : columns) {
            column.reset();
        }
        rows = 0;
    }

    private void open() throws IOException {
        if (writer == null) {
            empty = VectorSchemaRoot.create(schema, allocator); // only its schema is written (the file's header)
            writer = new Writer(empty, FileChannel.open(path, StandardOpenOption.CREATE,
                    StandardOpenOption.TRUNCATE_EXISTING, StandardOpenOption.WRITE));
            writer.start();
        }
    }

    /** Writes the last batch and the file's footer (a file without rows has the schema only). */
    @Override
    public void close() throws IOException {
        try {
            flush();
            open();
            writer.end();
        } finally {
            if (writer != null) {
                writer.close(); // and its channel
                empty.close();
            }
        }
    }

    /** {@link ArrowFileWriter} taking record batches built elsewhere. */
    private static final class Writer extends ArrowFileWriter {
        Writer(VectorSchemaRoot root, FileChannel out) {
            super(root, null, out);
        }

        void write(ArrowRecordBatch batch) throws IOException {
            writeRecordBatch(batch);
        }
    }

    /** One column (with its children) of the batch being built. */
    abstract static class Column {
        /** Adds the field nodes and buffers of the batch's values, in the Arrow format's order. */
        abstract void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator);

        abstract void reset();
    }

    private static ArrowBuf bytes(BufferAllocator allocator, byte[] values, int length) {
        ArrowBuf buffer = allocator.buffer(length);
        buffer.setBytes(0, values, 0, length);
        buffer.writerIndex(length); // what the IPC writer takes of it
        return buffer;
    }

    private static ArrowBuf ints(BufferAllocator allocator, int[] values, int count) {
        ArrowBuf buffer = allocator.buffer(4L * count);
        buffer.nioBuffer(0, 4 * count).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer().put(values, 0, count);
        buffer.writerIndex(4L * count);
        return buffer;
    }

    private static ArrowBuf longs(BufferAllocator allocator, long[] values, int count) {
        ArrowBuf buffer = allocator.buffer(8L * count);
        buffer.nioBuffer(0, 8 * count).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().put(values, 0, count);
        buffer.writerIndex(8L * count);
        return buffer;
    }

    /** The node and validity buffer of a column of {@code count} values without nulls (an empty bitmap, as the
     * format allows for a null count of 0). */
    private static void noNulls(int count, List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator a) {
        nodes.add(new ArrowFieldNode(count, 0));
        buffers.add(a.buffer(0));
    }

    /** A validity bitmap, made at the first null with every value before it set (a column without nulls has
     * none: the format allows an empty buffer for a null count of 0). */
    private static final class Validity {
        private byte[] bits;
        private int nulls;

        /** Value {@code index}'s bit. */
        void set(int index, boolean valid) {
            if (bits == null) {
                if (valid) {
                    return;
                }
                bits = new byte[Math.max(64, (index >>> 2) + 1)];
                Arrays.fill(bits, 0, (index + 7) >>> 3, (byte) 0xFF);
            } else if (bits.length <= index >>> 3) {
                bits = Arrays.copyOf(bits, 2 * bits.length);
            }
            if (valid) {
                bits[index >>> 3] |= (byte) (1 << (index & 7));
            } else {
                bits[index >>> 3] &= (byte) ~(1 << (index & 7));
                nulls++;
            }
        }

        void unload(int count, List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            nodes.add(new ArrowFieldNode(count, nulls));
            buffers.add(nulls == 0 ? allocator.buffer(0) : bytes(allocator, bits, (count + 7) >>> 3));
        }

        void reset() {
            bits = null;
            nulls = 0;
        }
    }

    /** int64 values, never null. */
    static final class Int64 extends Column {
        private long[] values = new long[4096];
        private int count;

        void add(long value) {
            if (count == values.length) {
                values = Arrays.copyOf(values, 2 * count);
            }
            values[count++] = value;
        }

        @Override
        void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            noNulls(count, nodes, buffers, allocator);
            buffers.add(longs(allocator, values, count));
        }

        @Override
        void reset() {
            count = 0;
        }
    }

    /** int32 values, nullable. */
    static final class Int32 extends Column {
        private int[] values = new int[4096];
        private final Validity validity = new Validity();
        private int count;

        void add(int value) {
            validity.set(count, true);
            put(value);
        }

        void addNull() {
            validity.set(count, false);
            put(0);
        }

        private void put(int value) {
            if (count == values.length) {
                values = Arrays.copyOf(values, 2 * count);
            }
            values[count++] = value;
        }

        @Override
        void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            validity.unload(count, nodes, buffers, allocator);
            buffers.add(ints(allocator, values, count));
        }

        @Override
        void reset() {
            validity.reset();
            count = 0;
        }
    }

    /** Booleans, nullable (bit-packed, as Arrow stores them). */
    static final class Bool extends Column {
        private byte[] bits = new byte[512];
        private final Validity validity = new Validity();
        private int count;

        void add(boolean value) {
            validity.set(count, true);
            put(value);
        }

        void addNull() {
            validity.set(count, false);
            put(false);
        }

        private void put(boolean value) {
            if (bits.length <= count >>> 3) {
                bits = Arrays.copyOf(bits, 2 * bits.length);
            }
            if (value) {
                bits[count >>> 3] |= (byte) (1 << (count & 7));
            } else {
                bits[count >>> 3] &= (byte) ~(1 << (count & 7));
            }
            count++;
        }

        @Override
        void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            validity.unload(count, nodes, buffers, allocator);
            buffers.add(bytes(allocator, bits, (count + 7) >>> 3));
        }

        @Override
        void reset() {
            validity.reset();
            count = 0;
        }
    }

    /** Variable-width values (utf8 or binary: the bytes are taken as given), nullable. */
    static final class Bytes extends Column {
        private int[] offsets = new int[4097]; // offsets[0] is 0
        private byte[] data;
        private final Validity validity = new Validity();
        private int count;
        private int size;

        /** {@code initialBytes}: room for the data of a batch, so that the first batches do not grow it often. */
        Bytes(int initialBytes) {
            data = new byte[initialBytes];
        }

        Bytes() {
            this(64 * 1024);
        }

        void add(byte[] bytes, int start, int length) {
            if (length > data.length - size) {
                grow(length);
            }
            System.arraycopy(bytes, start, data, size, length);
            size += length;
            validity.set(count, true);
            added();
        }

        void add(byte[] bytes) {
            add(bytes, 0, bytes.length);
        }

        void addNull() {
            validity.set(count, false);
            added();
        }

        int count() {
            return count;
        }

        private void grow(int length) {
            long grown = Math.max(2L * data.length, (long) size + length);
            if (grown > Integer.MAX_VALUE - 16) {
                throw new IllegalStateException("a batch's column would hold more than 2 GiB");
            }
            data = Arrays.copyOf(data, (int) grown);
        }

        private void added() {
            if (++count == offsets.length) {
                offsets = Arrays.copyOf(offsets, 2 * count);
            }
            offsets[count] = size;
        }

        @Override
        void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            validity.unload(count, nodes, buffers, allocator);
            buffers.add(ints(allocator, offsets, count + 1));
            buffers.add(bytes(allocator, data, size));
        }

        @Override
        void reset() {
            validity.reset();
            count = 0;
            size = 0;
        }
    }

    /** A list of {@code elements} per row (never null): add the row's elements, then {@link #end}. */
    static final class ListOf extends Column {
        final Bytes elements = new Bytes();
        private int[] offsets = new int[4097];
        private int count;

        void end() {
            if (++count == offsets.length) {
                offsets = Arrays.copyOf(offsets, 2 * count);
            }
            offsets[count] = elements.count();
        }

        @Override
        void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            noNulls(count, nodes, buffers, allocator);
            buffers.add(ints(allocator, offsets, count + 1));
            elements.unload(nodes, buffers, allocator);
        }

        @Override
        void reset() {
            elements.reset();
            count = 0;
        }
    }

    /** A map of string keys to string values per row (never null): add the row's keys and values, then
     * {@link #end}. The entries are a struct of (key, value), never null, as Arrow's map type has them. */
    static final class MapOf extends Column {
        final Bytes keys = new Bytes();
        final Bytes values = new Bytes();
        private int[] offsets = new int[4097];
        private int count;

        void end() {
            if (++count == offsets.length) {
                offsets = Arrays.copyOf(offsets, 2 * count);
            }
            offsets[count] = keys.count();
        }

        @Override
        void unload(List<ArrowFieldNode> nodes, List<ArrowBuf> buffers, BufferAllocator allocator) {
            noNulls(count, nodes, buffers, allocator);
            buffers.add(ints(allocator, offsets, count + 1));
            noNulls(keys.count(), nodes, buffers, allocator); // the entries struct: a validity buffer only
            keys.unload(nodes, buffers, allocator);
            values.unload(nodes, buffers, allocator);
        }

        @Override
        void reset() {
            keys.reset();
            values.reset();
            count = 0;
        }
    }
}
