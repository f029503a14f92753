package rmqlake.jvm;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * {@link CommonLineParser} from the command line, for comparing it with the reference line by line:
 *
 * <pre>java -cp rmqlake-jvm.jar rmqlake.jvm.ParseLinesTool OPTIONS LINES FIRST_LINE FILE_HASH32</pre>
 *
 * <p>OPTIONS is a tab-separated file of the parse options ({@link #readOptions}); LINES holds the lines (split on
 * newlines, a carriage return before a newline dropped, as the ingest reads them). One JSON object per line goes
 * to stdout: {@code {"line": N}} when the line is left undecided, else its record fields (binary ones base64).
 */
public final class ParseLinesTool {
    private ParseLinesTool() {}

    public static void main(String[] args) throws IOException {
        CommonLineParser parser = new CommonLineParser(readOptions(Files.readAllLines(Paths.get(args[0]), StandardCharsets.UTF_8)));
        byte[] data = Files.readAllBytes(Paths.get(args[1]));
        long number = Long.parseLong(args[2]);
        int fileHash32 = (int) Long.parseLong(args[3]);
        try (PrintStream out = new PrintStream(new BufferedOutputStream(System.out, 1 << 16), false, StandardCharsets.UTF_8)) {
            int start = 0;
            while (start < data.length) {
                int newline = start;
                while (newline < data.length && data[newline] != '\n') {
                    newline++;
                }
                int end = newline;
                if (end > start && data[end - 1] == '\r') {
                    end--;
                }
                CommonLineParser.Parsed parsed = parser.parse(data, start, end, number, fileHash32);
                out.println(parsed == null ? "{\"line\":" + number + "}" : json(number, parsed));
                number++;
                start = newline + 1;
            }
        }
    }

    /**
     * Options as lines of tab-separated fields: {@code default_queue_count N} (absent: none), {@code
     * max_message_size N}, {@code segment_size N}, {@code cluster_name S}, {@code default_store_host S}, {@code
     * default_born_host S}, {@code queue TOPIC N} per configured topic, {@code compaction TOPIC} per compacted
     * topic, and {@code month START PLAIN} per month (ascending; PLAIN 1 or 0).
     */
    public static CommonLineParser.Options readOptions(List<String> lines) {
        Map<String, String> values = new HashMap<>();
        Map<String, Integer> queues = new HashMap<>();
        Set<String> compaction = new HashSet<>();
        List<long[]> months = new ArrayList<>();
        for (String line : lines) {
            if (line.isEmpty()) {
                continue;
            }
            String[] fields = line.split("\t", -1);
            switch (fields[0]) {
                case "queue": queues.put(fields[1], Integer.parseInt(fields[2])); break;
                case "compaction": compaction.add(fields[1]); break;
                case "month": months.add(new long[] {Long.parseLong(fields[1]), Long.parseLong(fields[2])}); break;
                default: values.put(fields[0], fields.length > 1 ? fields[1] : ""); break;
            }
        }
        long[] starts = new long[months.size()];
        boolean[] plain = new boolean[months.size()];
        for (int i = 0; i < starts.length; i++) {
            starts[i] = months.get(i)[0];
            plain[i] = months.get(i)[1] == 1;
        }
        String defaultQueues = values.get("default_queue_count");
        return new CommonLineParser.Options(
                queues,
                defaultQueues == null || defaultQueues.isEmpty() ? null : Integer.valueOf(defaultQueues),
                compaction,
                Integer.parseInt(values.get("max_message_size")),
                Long.parseLong(values.get("segment_size")),
                values.getOrDefault("cluster_name", ""),
                values.get("default_store_host"),
                values.get("default_born_host"),
                starts,
                plain);
    }

    private static String json(long number, CommonLineParser.Parsed m) {
        Base64.Encoder base64 = Base64.getEncoder();
        byte[] body = Arrays.copyOfRange(m.bodyBytes, m.bodyOffset, m.bodyOffset + m.bodyLength);
        StringBuilder out = new StringBuilder(256 + body.length * 2);
        out.append("{\"line\":").append(number);
        field(out, "topic", m.topic);
        out.append(",\"queue_id\":").append(m.queueId);
        out.append(",\"flag\":").append(m.flag);
        out.append(",\"sys_flag\":").append(m.sysFlag);
        out.append(",\"magic\":").append(m.magic);
        out.append(",\"born_timestamp\":").append(m.bornTimestamp);
        field(out, "born_host", m.bornHost);
        out.append(",\"store_timestamp\":").append(m.storeTimestamp);
        field(out, "store_host", m.storeHost);
        field(out, "store_host_prefix", m.storeHostPrefix);
        out.append(",\"reconsume_times\":").append(m.reconsumeTimes);
        out.append(",\"prepared_transaction_offset\":").append(m.preparedTransactionOffset);
        field(out, "body", base64.encodeToString(body));
        out.append(",\"body_crc\":").append(m.bodyCrc);
        out.append(",\"properties\":[");
        for (int i = 0; i < m.properties.size(); i++) {
            out.append(i == 0 ? "[" : ",[");
            text(out, m.properties.get(i)[0]);
            out.append(',');
            text(out, m.properties.get(i)[1]);
            out.append(']');
        }
        out.append(']');
        field(out, "properties_bytes", base64.encodeToString(m.propertiesBytes));
        out.append(",\"keys\":[");
        for (int i = 0; i < m.keys.size(); i++) {
            if (i > 0) {
                out.append(',');
            }
            text(out, m.keys.get(i));
        }
        out.append(']');
        field(out, "tags", m.tags);
        field(out, "uniq_key", m.uniqKey);
        out.append(",\"total_size\":").append(m.totalSize);
        out.append(",\"real_queue_round_robin\":").append(m.realQueueRoundRobin);
        return out.append('}').toString();
    }

    private static void field(StringBuilder out, String name, String value) {
        out.append(",\"").append(name).append("\":");
        if (value == null) {
            out.append("null");
        } else {
            text(out, value);
        }
    }

    private static void text(StringBuilder out, String value) {
        out.append('"');
        for (int i = 0; i < value.length(); i++) {
            char c = value.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        out.append('"');
    }
}
