package rmqlake.jvm;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.zip.CRC32;

/**
 * Producer log lines of the common shape → record fields, in the JVM; every other line is left undecided.
 *
 * <p>The per-line parser of the Python package is the reference: it states every rule and every reject reason.
 * This one only <em>accepts</em>, and only lines whose outcome it can tell without doubt: a flat JSON object of
 * the known fields, strings without escapes, integers without fraction or exponent, a body that is plain text
 * or canonical base64, no delay level or timer (the broker re-routes those to its schedule topics), no
 * {@code endTransaction}. For such a line it computes what the reference computes (queue by the keys' hash,
 * the generated UNIQ_KEY, the properties in the broker's HashMap order, sizes, CRC). A transactional half send
 * ({@code TRAN_MSG} true) it stores as the broker does, on the half topic with its real topic and queue among its
 * properties. Any line it does not accept, it returns {@code null} for: the reference then accepts or rejects it,
 * with its reason.
 *
 * <p>The broker's HashMap order is the real one here ({@code java.util.HashMap} of capacity 128); a property set
 * whose names crowd one bucket to 8 entries (where the HashMap would make the bucket a tree) is left undecided, as
 * the reference does not model trees.
 */
public final class CommonLineParser {
    // The store's constants, as rmqlake.formats states them (the tests hold the outcomes to the Python parser's).
    static final int MAGIC_V1 = -626843481;
    static final int MAGIC_V2 = -626843477;
    static final int MAX_V1_TOPIC_CHARS = 127;
    static final int TOPIC_MAX_LENGTH = 127;
    static final int RETRY_TOPIC_MAX_BYTES = 255;
    static final String RETRY_TOPIC_PREFIX = "%RETRY%";
    static final int BORNHOST_V6_FLAG = 0x10;
    static final int STOREHOST_V6_FLAG = 0x20;
    static final int MAX_PROPERTIES_LENGTH = 32767;
    static final int RECORD_OVERHEAD_ALLOWANCE = 64 * 1024;
    static final int END_FILE_MIN_BLANK_LENGTH = 8;
    static final int FIXED_FIELDS_LENGTH = 74;
    static final int BROKER_MAP_CAPACITY = 128;
    static final int TREEIFY_THRESHOLD = 8;
    static final Set<String> FORBIDDEN_SEND_TOPICS = Set.of("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC");
    /** Properties the broker re-routes a message to its schedule topics by: a delay level, a timer. */
    static final Set<String> SCHEDULING = Set.of("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS");
    /** A transactional half send: stored on queue 0 of the half topic, its real topic and queue as properties. */
    static final String TRAN_MSG = "TRAN_MSG";
    static final String HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC";
    static final String TRANSACTION_ID = "__transactionId__";
    static final String REAL_TOPIC = "REAL_TOPIC";
    static final String REAL_QID = "REAL_QID";
    static final int TRANSACTION_TYPE_MASK = 0xC;
    static final Map<String, Integer> TRANSACTION_TYPES = Map.of("NOT_TYPE", 0x0, "PREPARED", 0x4, "COMMIT", 0x8, "ROLLBACK", 0xC);

    /** The configuration values a line's outcome depends on (the reference's ParseOptions). */
    public static final class Options {
        final Map<String, Integer> queueCounts;
        final Integer defaultQueueCount; // null: a topic not in queueCounts is refused
        final Set<String> compactionTopics;
        final int maxMessageSize;
        final long sizeLimit;
        final String clusterName;
        final String defaultStoreHost;
        final String defaultBornHost;
        /** Consecutive month starts in the broker's zone (epoch ms, ascending) as the reference computes them, and
         * per month whether its start is plain (no zone change within a day of it): a line born in a month whose
         * start or end is not plain, or outside the table, is left undecided. */
        final long[] monthStarts;
        final boolean[] plainMonths;

        public Options(
                Map<String, Integer> queueCounts,
                Integer defaultQueueCount,
                Set<String> compactionTopics,
                int maxMessageSize,
                long segmentSize,
                String clusterName,
                String defaultStoreHost,
                String defaultBornHost,
                long[] monthStarts,
                boolean[] plainMonths) {
            this.queueCounts = queueCounts;
            this.defaultQueueCount = defaultQueueCount;
            this.compactionTopics = compactionTopics;
            this.maxMessageSize = maxMessageSize;
            this.sizeLimit = Math.min((long) maxMessageSize + RECORD_OVERHEAD_ALLOWANCE, segmentSize - END_FILE_MIN_BLANK_LENGTH);
            this.clusterName = clusterName;
            this.defaultStoreHost = defaultStoreHost;
            this.defaultBornHost = defaultBornHost;
            this.monthStarts = monthStarts;
            this.plainMonths = plainMonths;
        }
    }

    /** An accepted line's record fields, in the reference's ParsedMessage order. */
    public static final class Parsed {
        public String topic;
        public Integer queueId; // null: chosen round robin when the message is appended
        public int flag;
        public int sysFlag;
        public int magic;
        public long bornTimestamp;
        public String bornHost;
        public long storeTimestamp;
        public String storeHost;
        public String storeHostPrefix;
        public int reconsumeTimes;
        public long preparedTransactionOffset;
        /** The body: {@code bodyLength} bytes of {@code bodyBytes} from {@code bodyOffset} (a plain body is not
         * copied out of the line: valid until the next line is read into the same buffer). */
        public byte[] bodyBytes;
        public int bodyOffset;
        public int bodyLength;
        public int bodyCrc;
        public List<String[]> properties; // (name, value) in storage order
        public byte[] propertiesBytes;
        public List<String> keys;
        public String tags;
        public String uniqKey;
        public int totalSize;
        /** A half sent without a queue: its REAL_QID (0 here) is its real topic's round-robin turn at the append;
         * {@code null} for a message stored on its own topic. */
        public Boolean realQueueRoundRobin;
        /** The topic a half was sent to (its REAL_TOPIC); {@code null} for a message stored on its own topic. */
        public String realTopic;
    }

    private static final class TopicInfo {
        final boolean valid;
        final int queueCount;
        final int magic;
        final int length;
        final boolean compaction;

        TopicInfo(boolean valid, int queueCount, int magic, int length, boolean compaction) {
            this.valid = valid;
            this.queueCount = queueCount;
            this.magic = magic;
            this.length = length;
            this.compaction = compaction;
        }
    }

    private final Options options;
    private final Map<String, TopicInfo> topics = new HashMap<>();
    private final Map<String, Hosts.Host> hosts = new HashMap<>();
    private final Map<String, String> uniqPrefixes = new HashMap<>();
    // the host (an object of the hosts cache) and file hash of the last prefix found, and the prefix
    private Hosts.Host lastUniqHost;
    private int lastUniqHash32;
    private String lastUniqPrefix;
    private final Map<List<String>, List<String>> layouts = new HashMap<>();
    private final CRC32 crc = new CRC32();

    public CommonLineParser(Options options) {
        this.options = options;
    }

    /**
     * The record fields of {@code line[start, end)} (one line without its newline), or {@code null}: not decided
     * here (the reference decides).
     *
     * @param sourceLine the 1-based line number (the generated UNIQ_KEY's counter)
     * @param fileHash32 32 bits of the input file's content hash (the generated UNIQ_KEY's pid and class-loader hash)
     */
    public Parsed parse(byte[] line, int start, int end, long sourceLine, int fileHash32) {
        LineFields fields = LineFields.read(line, start, end);
        if (fields == null || fields.topic == null || !fields.hasBody || fields.bornTimestamp == null) {
            return null;
        }
        String topic = fields.topic;
        if (FORBIDDEN_SEND_TOPICS.contains(topic)) {
            return null;
        }
        TopicInfo info = topic(topic);
        if (!info.valid) {
            return null;
        }
        byte[] body;
        int bodyOffset;
        int bodyLength;
        String encoding = fields.bodyEncoding;
        if (encoding == null || encoding.equals("utf8") || encoding.equals("utf-8")) {
            body = line;
            bodyOffset = fields.bodyStart;
            bodyLength = fields.bodyEnd - fields.bodyStart;
        } else if (encoding.equals("base64")) {
            body = canonicalBase64(line, fields.bodyStart, fields.bodyEnd);
            if (body == null) {
                return null;
            }
            bodyOffset = 0;
            bodyLength = body.length;
        } else {
            return null;
        }
        if (bodyLength > options.maxMessageSize) {
            return null;
        }
        String keys = fields.keys;
        if (fields.keyList != null) {
            for (String token : fields.keyList) {
                if (token.indexOf(' ') >= 0) {
                    return null;
                }
            }
            keys = String.join(" ", fields.keyList);
        }
        if (keys != null && keys.isEmpty()) {
            keys = null;
        }
        String tags = fields.tags != null && !fields.tags.isEmpty() ? fields.tags : null;
        long born = fields.bornTimestamp;
        if (born < 0) {
            return null;
        }
        long stored = fields.storeTimestamp != null ? fields.storeTimestamp : born;
        if (stored < 0) {
            return null;
        }
        long flag = fields.flag != null ? fields.flag : 0;
        if (flag < Integer.MIN_VALUE || flag > Integer.MAX_VALUE) {
            return null;
        }
        long reconsume = fields.reconsumeTimes != null ? fields.reconsumeTimes : 0;
        if (reconsume < 0 || reconsume > Integer.MAX_VALUE) {
            return null;
        }
        long prepared = fields.preparedTransactionOffset != null ? fields.preparedTransactionOffset : 0;
        if (prepared < 0) {
            return null;
        }
        Integer transactionFlag = TRANSACTION_TYPES.get(fields.transaction != null ? fields.transaction : "NOT_TYPE");
        if (transactionFlag == null) {
            return null;
        }
        Hosts.Host bornHost = host(fields.bornHost != null && !fields.bornHost.isEmpty() ? fields.bornHost : options.defaultBornHost);
        Hosts.Host storeHost = host(fields.storeHost != null && !fields.storeHost.isEmpty() ? fields.storeHost : options.defaultStoreHost);
        if (bornHost == null || storeHost == null) {
            return null;
        }
        Integer queueId = null;
        if (fields.queueId != null) {
            long given = fields.queueId;
            if (given < 0 || given >= info.queueCount) {
                return null;
            }
            queueId = (int) given;
        }
        List<String> keyList = new ArrayList<>();
        if (keys != null) {
            for (String token : keys.split(" ", -1)) {
                if (!token.isEmpty()) {
                    keyList.add(token);
                }
            }
            if (queueId == null) {
                queueId = Math.abs(keys.hashCode() % info.queueCount); // SelectMessageQueueByHash
            }
        }
        if (info.compaction && keyList.isEmpty()) {
            return null;
        }
        String uniq = fields.uniqKey;
        if (uniq == null || uniq.isEmpty()) {
            uniq = generatedUniqKey(bornHost, fileHash32, born, sourceLine);
            if (uniq == null) {
                return null;
            }
        }

        // The broker's HashMap: a repeated name keeps its first position and takes the last value.
        LinkedHashMap<String, String> merged = new LinkedHashMap<>();
        if (fields.properties != null) {
            for (String[] pair : fields.properties) {
                if (SCHEDULING.contains(pair[0])) {
                    return null; // re-routed by the broker: the reference applies the routing
                }
                if (!pair[0].isEmpty() && !pair[1].isEmpty()) { // the broker's parser drops empty names and values
                    merged.put(pair[0], pair[1]);
                }
            }
        }
        if (keys != null) {
            merged.put("KEYS", keys);
        }
        if (tags != null) {
            merged.put("TAGS", tags);
        }
        merged.put("UNIQ_KEY", uniq);
        if (!options.clusterName.isEmpty()) {
            merged.put("CLUSTER", options.clusterName);
        }
        // A half send (Boolean.parseBoolean of TRAN_MSG): the broker adds its transaction id and real topic and
        // queue to the same map, stores it on queue 0 of the half topic and clears the transaction type.
        String transactional = merged.get(TRAN_MSG);
        String realTopic = null;
        Boolean realQueueRoundRobin = null;
        if (transactional != null) {
            if (!isTrue(transactional)) {
                return null; // stored as sent, TRAN_MSG and all: the reference decides
            }
            merged.put(TRANSACTION_ID, uniq);
            merged.put(REAL_TOPIC, topic);
            merged.put(REAL_QID, Integer.toString(queueId != null ? queueId : 0)); // 0: the turn, at the append
            realTopic = topic;
            realQueueRoundRobin = queueId == null;
            topic = HALF_TOPIC;
            info = topic(HALF_TOPIC);
            queueId = 0;
            transactionFlag &= ~TRANSACTION_TYPE_MASK;
        }
        List<String> order = layout(new ArrayList<>(merged.keySet()));
        if (order == null) {
            return null;
        }
        List<String[]> properties = new ArrayList<>(order.size());
        int chars = 0;
        for (String name : order) {
            String value = merged.get(name);
            properties.add(new String[] {name, value});
            chars += name.length() + value.length() + 2;
        }
        StringBuilder serialised = new StringBuilder(chars); // sized once: growing it was ~5 % of the parse
        for (String[] pair : properties) {
            serialised.append(pair[0]).append('\u0001').append(pair[1]).append('\u0002');
        }
        byte[] propertiesBytes = serialised.toString().getBytes(StandardCharsets.UTF_8);
        if (propertiesBytes.length > MAX_PROPERTIES_LENGTH) {
            return null;
        }
        int sysFlag = transactionFlag;
        if (bornHost.isIpv6()) {
            sysFlag |= BORNHOST_V6_FLAG;
        }
        if (storeHost.isIpv6()) {
            sysFlag |= STOREHOST_V6_FLAG;
        }
        long size = FIXED_FIELDS_LENGTH
                + bornHost.address.length + 4
                + storeHost.address.length + 4
                + (info.magic == MAGIC_V1 ? 1 : 2)
                + info.length
                + bodyLength
                + propertiesBytes.length;
        if (size > options.sizeLimit) {
            return null;
        }
        crc.reset();
        crc.update(body, bodyOffset, bodyLength);

        Parsed out = new Parsed();
        out.topic = topic;
        out.queueId = queueId;
        out.flag = (int) flag;
        out.sysFlag = sysFlag;
        out.magic = info.magic;
        out.bornTimestamp = born;
        out.bornHost = bornHost.text;
        out.storeTimestamp = stored;
        out.storeHost = storeHost.text;
        out.storeHostPrefix = storeHost.msgIdPrefix;
        out.reconsumeTimes = (int) reconsume;
        out.preparedTransactionOffset = prepared;
        out.bodyBytes = body;
        out.bodyOffset = bodyOffset;
        out.bodyLength = bodyLength;
        out.bodyCrc = (int) (crc.getValue() & 0x7FFFFFFF);
        out.properties = properties;
        out.propertiesBytes = propertiesBytes;
        out.keys = keyList;
        out.tags = tags;
        out.uniqKey = uniq;
        out.totalSize = (int) size;
        out.realQueueRoundRobin = realQueueRoundRobin;
        out.realTopic = realTopic;
        return out;
    }

    /** {@code Boolean.parseBoolean}, for ASCII letters: "true" in any case. */
    private static boolean isTrue(String value) {
        return value.length() == 4 && value.toLowerCase(java.util.Locale.ROOT).equals("true")
                && value.chars().allMatch(c -> c < 0x80);
    }

    private TopicInfo topic(String topic) {
        TopicInfo info = topics.get(topic);
        if (info == null) {
            info = topicInfo(topic);
            if (topics.size() < 65536) {
                topics.put(topic, info);
            }
        }
        return info;
    }

    private TopicInfo topicInfo(String topic) {
        boolean valid = !topic.isEmpty();
        for (int i = 0; i < topic.length() && valid; i++) {
            char c = topic.charAt(i);
            valid = c == '%' || c == '|' || c == '_' || c == '-'
                    || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        }
        int length = topic.length(); // ASCII: bytes = chars
        if (valid) {
            valid = topic.startsWith(RETRY_TOPIC_PREFIX) ? length <= RETRY_TOPIC_MAX_BYTES : length <= TOPIC_MAX_LENGTH;
        }
        Integer queues = options.queueCounts.getOrDefault(topic, options.defaultQueueCount);
        if (queues == null || queues < 1) {
            valid = false; // unknown (no auto-creation), or a count the configuration never allows: not decided here
        }
        int magic = length > MAX_V1_TOPIC_CHARS ? MAGIC_V2 : MAGIC_V1;
        return new TopicInfo(valid, queues == null ? 1 : queues, magic, length, options.compactionTopics.contains(topic));
    }

    private Hosts.Host host(String text) {
        Hosts.Host host = hosts.get(text);
        if (host == null && !hosts.containsKey(text)) {
            host = Hosts.parse(text);
            if (hosts.size() < 65536) {
                hosts.put(text, host);
            }
        }
        return host;
    }

    /** {@code MessageClientIDSetter}'s layout: ip + pid + class-loader hash, then ms since the month start and
     * the counter, upper-case hex; {@code null} when the born time's month is not in the table. */
    private String generatedUniqKey(Hosts.Host bornHost, int fileHash32, long born, long counter) {
        if (bornHost == lastUniqHost && fileHash32 == lastUniqHash32) { // the lines of a file mostly share a host
            return uniqKey(lastUniqPrefix, born, counter);
        }
        String key = bornHost.text + "|" + fileHash32;
        String prefix = uniqPrefixes.get(key);
        if (prefix == null) {
            byte[] fixed = new byte[bornHost.address.length + 6];
            System.arraycopy(bornHost.address, 0, fixed, 0, bornHost.address.length);
            int at = bornHost.address.length;
            short pid = (short) (fileHash32 >> 16);
            fixed[at] = (byte) (pid >>> 8);
            fixed[at + 1] = (byte) pid;
            fixed[at + 2] = (byte) (fileHash32 >>> 24);
            fixed[at + 3] = (byte) (fileHash32 >>> 16);
            fixed[at + 4] = (byte) (fileHash32 >>> 8);
            fixed[at + 5] = (byte) fileHash32;
            prefix = Hex.upper(fixed);
            if (uniqPrefixes.size() < 65536) {
                uniqPrefixes.put(key, prefix);
            }
        }
        lastUniqHost = bornHost;
        lastUniqHash32 = fileHash32;
        lastUniqPrefix = prefix;
        return uniqKey(prefix, born, counter);
    }

    private String uniqKey(String prefix, long born, long counter) {
        long monthStart = monthStart(born);
        if (monthStart == Long.MIN_VALUE) {
            return null;
        }
        int diff = (int) (born - monthStart); // Java's (int) cast, as the client's
        if (diff > -1_000_000 && diff < 0) {
            diff = 0;
        }
        StringBuilder out = new StringBuilder(prefix.length() + 12).append(prefix);
        Hex.append(out, diff & 0xFFFFFFFFL, 8);
        Hex.append(out, counter & 0xFFFF, 4);
        return out.toString();
    }

    /** The start of {@code born}'s month from the table, or {@code Long.MIN_VALUE}: outside it, or a month whose
     * bounds are not plain (a zone change near them), which the reference decides. */
    private long monthStart(long born) {
        long[] starts = options.monthStarts;
        int found = Arrays.binarySearch(starts, born);
        int month = found >= 0 ? found : -found - 2; // the last start at or before born
        if (month < 0 || month + 1 >= starts.length || !options.plainMonths[month] || !options.plainMonths[month + 1]) {
            return Long.MIN_VALUE;
        }
        return starts[month];
    }

    /** The storage order of a property-name set (insertion order): the broker's HashMap(128); {@code null} when a
     * bucket would hold 8 or more names (a tree bin). */
    private List<String> layout(List<String> names) {
        List<String> order = layouts.get(names);
        if (order != null || layouts.containsKey(names)) {
            return order;
        }
        HashMap<String, Boolean> map = new HashMap<>(BROKER_MAP_CAPACITY);
        for (String name : names) {
            map.put(name, Boolean.TRUE);
        }
        int capacity = BROKER_MAP_CAPACITY;
        while (names.size() > capacity * 3 / 4) {
            capacity *= 2;
        }
        Map<Integer, Integer> perBucket = new HashMap<>();
        boolean crowded = false;
        for (String name : names) {
            int h = name.hashCode();
            int bucket = (h ^ (h >>> 16)) & (capacity - 1);
            crowded |= perBucket.merge(bucket, 1, Integer::sum) >= TREEIFY_THRESHOLD;
        }
        order = crowded ? null : new ArrayList<>(map.keySet());
        if (layouts.size() < 65536) {
            layouts.put(names, order);
        }
        return order;
    }

    /** The bytes of canonical base64 text (padded, no other characters, re-encoding gives it back), else null. */
    private static byte[] canonicalBase64(byte[] line, int start, int end) {
        int length = end - start;
        if (length % 4 != 0) {
            return null;
        }
        byte[] text = Arrays.copyOfRange(line, start, end);
        byte[] decoded;
        try {
            decoded = Base64.getDecoder().decode(text);
        } catch (IllegalArgumentException e) {
            return null;
        }
        return Arrays.equals(Base64.getEncoder().encode(decoded), text) ? decoded : null;
    }
}
