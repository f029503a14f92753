package rmqlake.jvm;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * The ingest's parse stage in the JVM, as a Spark job the Python driver starts (through py4j): one task per
 * input split runs {@link SplitScratch} over it and leaves, under their final names, the files the Python parse
 * task would write for the split's messages of the common shape:
 *
 * <ul>
 *   <li>the scratch file: the messages, in the scratch schema (Arrow IPC, batches of {@link SplitScratch#BATCH_ROWS});
 *   <li>the narrow file: their narrow rows in the append order ({@link NarrowRows}, Arrow IPC);
 *   <li>the undecided file: the lines left to the per-line parser (line number and bytes, Arrow IPC).
 * </ul>
 *
 * <p>A file with no row is not written. Each is written under a hidden temporary name in its folder and moved into
 * place when complete, as the Python writers do: a retried task replaces it, a killed one leaves only hidden
 * files, which the run's clean-up removes with its scratch folder.
 *
 * <p>A split the JVM cannot parse (a line too long to hold, or a fault of this code on some input) is given back:
 * its files are not written and its answer says why, and the Python route parses the whole split. A failure to
 * read or write a file fails the task, as it would in Python.
 */
public final class IngestParse {
    private IngestParse() {}

    /**
     * Parses the splits of {@code tasks} (a line each: split, file rank, path, start, end, first line, hash32,
     * scratch path, narrow path, undecided path, tab-separated; paths absolute and local) with the parse options
     * of {@code options} ({@link ParseLinesTool#readOptions}); returns a line per split: split, lines, accepted,
     * undecided, accepted halves, the latest store time of the accepted messages (empty: none), tab-separated; or
     * split, "gave up" and the reason, for a split left to the Python route.
     */
    public static String run(JavaSparkContext context, String options, String tasks) {
        List<String> lines = Arrays.asList(tasks.split("\n"));
        List<String> counts = context.parallelize(lines, lines.size()).map(task -> parseSplit(options, task)).collect();
        return String.join("\n", counts);
    }

    static String parseSplit(String optionsText, String taskLine) throws IOException {
        String[] task = taskLine.split("\t", -1);
        if (task.length != 10) {
            throw new IllegalArgumentException("a parse task has 10 tab-separated fields, not " + task.length);
        }
        CommonLineParser.Options options = ParseLinesTool.readOptions(Arrays.asList(optionsText.split("\n")));
        int split = Integer.parseInt(task[0]);
        NarrowRows narrow = new NarrowRows(split, Integer.parseInt(task[1]));
        Path scratch = Paths.get(task[7]);
        Path narrowPath = Paths.get(task[8]);
        Path undecided = Paths.get(task[9]);
        List<Path> temporaries = new ArrayList<>();
        try {
            Path scratchTemporary = temporary(scratch, temporaries);
            Path undecidedTemporary = temporary(undecided, temporaries);
            long[] counts;
            try {
                counts = SplitScratch.parse(task[2], Long.parseLong(task[3]), Long.parseLong(task[4]),
                        Long.parseLong(task[5]), (int) Long.parseLong(task[6]), options, scratchTemporary.toString(),
                        undecidedTemporary.toString(), narrow);
            } catch (UncheckedIOException e) {
                throw e;
            } catch (RuntimeException e) {
                String reason = (e instanceof SplitScratch.LineTooLong ? "" : e.getClass().getName() + ": ")
                        + e.getMessage();
                return split + "\tgave up\t" + reason.replaceAll("[\\t\\r\\n]", " ");
            }
            if (counts[1] > 0) {
                Path narrowTemporary = temporary(narrowPath, temporaries);
                narrow.write(narrowTemporary);
                place(narrowTemporary, narrowPath);
                place(scratchTemporary, scratch);
            }
            if (counts[2] > 0) {
                place(undecidedTemporary, undecided);
            }
            String latest = counts[1] > 0 ? Long.toString(narrow.lastStoreTimestamp()) : "";
            return split + "\t" + counts[0] + "\t" + counts[1] + "\t" + counts[2] + "\t" + counts[3] + "\t" + latest;
        } finally {
            for (Path path : temporaries) {
                Files.deleteIfExists(path);
            }
        }
    }

    /** A new hidden file beside {@code path} ({@code .NAME.RANDOM.tmp}), its folder created. */
    private static Path temporary(Path path, List<Path> temporaries) throws IOException {
        Files.createDirectories(path.getParent());
        String random = UUID.randomUUID().toString().replace("-", "").substring(0, 12);
        Path temporary = path.resolveSibling("." + path.getFileName() + "." + random + ".tmp");
        Files.createFile(temporary);
        temporaries.add(temporary);
        return temporary;
    }

    private static void place(Path temporary, Path path) {
        try {
            Files.move(temporary, path, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        } catch (IOException e) {
            throw new UncheckedIOException("could not move " + temporary + " to " + path, e);
        }
    }
}
