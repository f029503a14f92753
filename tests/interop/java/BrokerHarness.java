import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.io.File;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.namesrv.NamesrvConfig;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.store.MessageStore;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * A real RocketMQ name server and broker, in this JVM, serving a store directory written by
 * {@code rmqlake export-store}, and real consumers reading it.
 *
 * <p>Usage: {@code BrokerHarness SPEC.json}; the answer is one JSON object on the last line of
 * stdout. The spec names the store (the broker writes to it: give it a copy), a scratch folder, the
 * store's file sizes and the consumer groups to run, one after the other:
 *
 * <pre>
 * {"store": "...", "work": "...", "cluster": "DefaultCluster", "timeoutSeconds": 90,
 *  "commitlogSegmentSize": 65536, "cqUnitsPerFile": 1000, "indexSlots": 64, "indexMaxEntries": 500,
 *  "groups": [{"group": "cg_billing", "topics": ["OrderEvents"], "fromFirst": false,
 *              "autoCreateSubscriptionGroup": false, "maxSeconds": 20}, ...]}
 * </pre>
 *
 * <p>Everything listens on 127.0.0.1 only (the HA port, which the broker binds on every interface,
 * is a free port nobody connects to; the name server's own client tries this host's address once
 * and finds nothing there). The broker creates no topic (topics come from the store's
 * config/topics.json); whether it creates subscription groups is set per consumer group, before it
 * starts. Each group is a {@link DefaultLitePullConsumer} that subscribes
 * to its topics and polls until every queue is read to the broker's max offset, then a little longer
 * to catch anything past it. The result lists what the broker holds (per queue min and max offset,
 * the group's committed offset as the broker loaded it) and what each group received. Name server,
 * broker and consumers are shut down in a finally; a watchdog halts the JVM after timeoutSeconds.
 *
 * <p>A spec may also set the broker's scheduled-message services ({@code messageDelayLevel},
 * {@code timerMaxDelaySec}, {@code timerLogFileSize}) and {@code "expectMessages": {"T": 5},
 * "settleMillis": 3000}: before the groups run, wait until each such topic holds that many messages
 * (what the broker delivers from the store's pending scheduled messages included), then that long
 * to catch anything delivered twice; the answer's {@code delivered} says whether they all arrived.
 * With {@code "haltAfterAnswer": true} the JVM halts once the answer is printed, without the broker's
 * shutdown (some 20 s), for a caller that does not read the store afterwards.
 */
public class BrokerHarness {
    private static final String HOST = "127.0.0.1";
    private static final long GRACE_MILLIS = 1500;

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable failure) {
            failure.printStackTrace();
            System.exit(1);  // the broker is shut down; its and the client's non-daemon threads may remain
        }
        System.exit(0);  // client and broker leave non-daemon threads behind
    }

    private static void run(String[] args) throws Exception {
        JSONObject spec = JSON.parseObject(new String(Files.readAllBytes(Paths.get(args[0])), StandardCharsets.UTF_8));
        String work = spec.getString("work");
        int timeout = spec.getIntValue("timeoutSeconds");
        startWatchdog(timeout);
        System.setProperty("rocketmq.client.logRoot", work + File.separator + "client-logs");
        // as the broker's own start-up does: without it requests carry version 0 and the name server
        // reads a registration as a pre-3.0.11 broker's, which carries no topics
        System.setProperty(RemotingCommand.REMOTING_VERSION_KEY, Integer.toString(MQVersion.CURRENT_VERSION));
        JSONObject result = new JSONObject(true);
        result.put("rocketmqVersion", MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION));
        NamesrvController namesrv = null;
        BrokerController broker = null;
        try {
            int namesrvPort = freePorts(0);
            namesrv = startNamesrv(work, namesrvPort);
            String namesrvAddr = HOST + ":" + namesrvPort;
            broker = startBroker(spec, namesrvAddr, freePorts(2));
            result.put("brokerAddr", broker.getBrokerAddr());
            progress("broker " + broker.getBrokerAddr() + " started on " + spec.getString("store"));
            if (spec.containsKey("expectMessages")) {  // what the broker's own services append, before reading
                result.put("delivered", awaitMessages(broker, spec));
                Thread.sleep(spec.getLongValue("settleMillis"));
            }
            waitForRegistration(namesrv, spec, Math.min(30, timeout / 3));
            progress("the name server routes the topics");
            result.put("topics", topics(broker));
            JSONArray groups = new JSONArray();
            for (Object item : spec.getJSONArray("groups")) {
                groups.add(consume(broker, namesrvAddr, (JSONObject) item));
            }
            result.put("groups", groups);
            result.put("queues", queues(broker, spec));
            if (spec.getBooleanValue("haltAfterAnswer")) {  // the caller reads the answer, not the store after it
                answer(result);
                Runtime.getRuntime().halt(0);
            }
        } finally {
            if (broker != null) {
                broker.shutdown();
            }
            if (namesrv != null) {
                namesrv.shutdown();
            }
        }
        answer(result);
    }

    private static void answer(JSONObject result) {
        System.out.println();
        System.out.println(JSON.toJSONString(result));
        System.out.flush();
    }

    static void progress(String line) {
        System.err.println("BrokerHarness: " + line);
    }

    static void startWatchdog(int seconds) {
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(seconds * 1000L);
            } catch (InterruptedException e) {
                return;
            }
            System.err.println("BrokerHarness: gave up after " + seconds + " s; halting the JVM");
            Runtime.getRuntime().halt(3);
        }, "harness-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
    }

    /** A port p free on 127.0.0.1 such that p - below ... p + 1 are free too (the broker's fast and HA ports). */
    static int freePorts(int below) throws IOException {
        for (int attempt = 0; attempt < 200; attempt++) {
            int port;
            try (ServerSocket probe = new ServerSocket(0, 1, InetAddress.getByName(HOST))) {
                port = probe.getLocalPort();
            }
            if (port - below < 1024 || port + 1 > 65535) {
                continue;
            }
            boolean free = true;
            for (int p = port - below; p <= port + 1 && free; p++) {
                try (ServerSocket probe = new ServerSocket()) {
                    probe.bind(new InetSocketAddress(p == port + 1 ? "0.0.0.0" : HOST, p));
                } catch (IOException busy) {
                    free = false;
                }
            }
            if (free) {
                return port;
            }
        }
        throw new IOException("no free port range on " + HOST);
    }

    static NamesrvController startNamesrv(String work, int port) throws Exception {
        NamesrvConfig config = new NamesrvConfig();
        config.setKvConfigPath(work + File.separator + "namesrv" + File.separator + "kvConfig.json");
        config.setConfigStorePath(work + File.separator + "namesrv" + File.separator + "namesrv.properties");
        NettyServerConfig server = new NettyServerConfig();
        server.setBindAddress(HOST);
        server.setListenPort(port);
        NamesrvController controller = new NamesrvController(config, server);
        if (!controller.initialize()) {
            throw new IllegalStateException("the name server did not initialize");
        }
        controller.start();
        return controller;
    }

    static BrokerController startBroker(JSONObject spec, String namesrvAddr, int port) throws Exception {
        String store = spec.getString("store");
        if (!new File(store, "config" + File.separator + "topics.json").isFile()) {
            throw new IllegalArgumentException(store + " holds no config/topics.json: not an exported store");
        }
        BrokerConfig broker = new BrokerConfig();
        broker.setBrokerClusterName(spec.getString("cluster"));
        broker.setBrokerName("rmqlake-broker");
        broker.setBrokerIP1(HOST);
        broker.setBrokerIP2(HOST);
        broker.setNamesrvAddr(namesrvAddr);
        broker.setAutoCreateTopicEnable(false);  // serve the topics of the export's topics.json, nothing else
        broker.setAutoCreateSubscriptionGroup(false);  // set per group below
        MessageStoreConfig storeConfig = new MessageStoreConfig();
        storeConfig.setStorePathRootDir(store);
        storeConfig.setStorePathCommitLog(store + File.separator + "commitlog");
        storeConfig.setMappedFileSizeCommitLog(spec.getIntValue("commitlogSegmentSize"));
        storeConfig.setMappedFileSizeConsumeQueue(spec.getIntValue("cqUnitsPerFile") * 20);
        storeConfig.setMaxHashSlotNum(spec.getIntValue("indexSlots"));
        storeConfig.setMaxIndexNum(spec.getIntValue("indexMaxEntries"));
        storeConfig.setHaListenPort(port + 1);
        // the scheduled-message services, when a spec sets them (ScheduleHarness: short delays, small timer files)
        if (spec.containsKey("messageDelayLevel")) {
            storeConfig.setMessageDelayLevel(spec.getString("messageDelayLevel"));
        }
        if (spec.containsKey("timerMaxDelaySec")) {
            storeConfig.setTimerMaxDelaySec(spec.getIntValue("timerMaxDelaySec"));
        }
        if (spec.containsKey("timerLogFileSize")) {
            storeConfig.setMappedFileSizeTimerLog(spec.getIntValue("timerLogFileSize"));
        }
        NettyServerConfig server = new NettyServerConfig();
        server.setBindAddress(HOST);
        server.setListenPort(port);  // the fast server listens on port - 2
        BrokerController controller = new BrokerController(broker, server, new NettyClientConfig(), storeConfig);
        if (!controller.initialize()) {
            throw new IllegalStateException("the broker did not initialize on " + store + " (see the broker log)");
        }
        controller.start();
        return controller;
    }

    private static void waitForRegistration(NamesrvController namesrv, JSONObject spec, int seconds)
        throws InterruptedException {
        List<String> topics = new ArrayList<>();
        for (Object item : spec.getJSONArray("groups")) {
            for (Object topic : ((JSONObject) item).getJSONArray("topics")) {
                topics.add((String) topic);
            }
        }
        waitForTopics(namesrv, topics, seconds);
    }

    static void waitForTopics(NamesrvController namesrv, Collection<String> topics, int seconds)
        throws InterruptedException {
        long deadline = System.currentTimeMillis() + seconds * 1000L;
        for (String topic : topics) {
            while (namesrv.getRouteInfoManager().pickupTopicRouteData(topic) == null) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("topic " + topic + " never reached the name server");
                }
                Thread.sleep(50);
            }
        }
    }

    /**
     * Waits until each topic of the spec's {@code expectMessages} holds that many messages (the sum of its
     * queues' max offsets), at most half of {@code timeoutSeconds}; whether they all arrived.
     */
    static boolean awaitMessages(BrokerController broker, JSONObject spec) throws Exception {
        JSONObject expected = spec.getJSONObject("expectMessages");
        long deadline = System.currentTimeMillis() + spec.getIntValue("timeoutSeconds") * 1000L / 2;
        while (System.currentTimeMillis() < deadline) {
            boolean all = true;
            for (Map.Entry<String, Object> entry : expected.entrySet()) {
                if (held(broker, entry.getKey()) < ((Number) entry.getValue()).longValue()) {
                    all = false;
                }
            }
            if (all) {
                return true;
            }
            Thread.sleep(100);
        }
        return false;
    }

    private static long held(BrokerController broker, String topic) throws Exception {
        MessageStore store = broker.getMessageStore();
        long total = 0;
        int count = broker.getTopicConfigManager().selectTopicConfig(topic).getReadQueueNums();
        for (int queue = 0; queue < count; queue++) {
            total += store.getMaxOffsetInQueue(topic, queue);
        }
        return total;
    }

    private static JSONObject topics(BrokerController broker) {
        JSONObject topics = new JSONObject(new TreeMap<>());
        for (Map.Entry<String, TopicConfig> entry : broker.getTopicConfigManager().getTopicConfigTable().entrySet()) {
            TopicConfig config = entry.getValue();
            JSONObject row = new JSONObject(true);
            row.put("readQueueNums", config.getReadQueueNums());
            row.put("writeQueueNums", config.getWriteQueueNums());
            row.put("perm", config.getPerm());
            row.put("attributes", config.getAttributes());
            topics.put(entry.getKey(), row);
        }
        return topics;
    }

    private static JSONArray queues(BrokerController broker, JSONObject spec) throws Exception {
        MessageStore store = broker.getMessageStore();
        JSONArray rows = new JSONArray();
        Map<String, Boolean> seen = new HashMap<>();
        for (Object item : spec.getJSONArray("groups")) {
            for (Object name : ((JSONObject) item).getJSONArray("topics")) {
                String topic = (String) name;
                if (seen.put(topic, true) != null) {
                    continue;
                }
                int count = broker.getTopicConfigManager().selectTopicConfig(topic).getReadQueueNums();
                for (int queue = 0; queue < count; queue++) {
                    JSONObject row = new JSONObject(true);
                    row.put("topic", topic);
                    row.put("queueId", queue);
                    row.put("minOffset", store.getMinOffsetInQueue(topic, queue));
                    row.put("maxOffset", store.getMaxOffsetInQueue(topic, queue));
                    rows.add(row);
                }
            }
        }
        return rows;
    }

    private static JSONObject consume(BrokerController broker, String namesrvAddr, JSONObject group) throws Exception {
        String name = group.getString("group");
        broker.getBrokerConfig().setAutoCreateSubscriptionGroup(group.getBooleanValue("autoCreateSubscriptionGroup"));
        MessageStore store = broker.getMessageStore();
        // per queue: where reading starts (the committed offset the broker loaded, or the queue's min) and its max
        Map<String, long[]> bounds = new TreeMap<>();
        JSONObject committed = new JSONObject(new TreeMap<>());
        for (Object item : group.getJSONArray("topics")) {
            String topic = (String) item;
            int count = broker.getTopicConfigManager().selectTopicConfig(topic).getReadQueueNums();
            for (int queue = 0; queue < count; queue++) {
                long offset = broker.getConsumerOffsetManager().queryOffset(name, topic, queue);
                committed.put(topic + "/" + queue, offset);
                long min = store.getMinOffsetInQueue(topic, queue);
                long start = group.getBooleanValue("fromFirst") || offset < 0 ? min : Math.max(offset, min);
                bounds.put(topic + "/" + queue, new long[] {start, store.getMaxOffsetInQueue(topic, queue)});
            }
        }
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(name);
        consumer.setNamesrvAddr(namesrvAddr);
        consumer.setInstanceName("rmqlake-" + name);
        consumer.setClientIP(HOST);
        consumer.setAutoCommit(false);  // read only: the committed offsets stay what the lake holds
        consumer.setConsumeFromWhere(group.getBooleanValue("fromFirst")
            ? ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET : ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        JSONArray messages = new JSONArray();
        Map<String, Long> next = new HashMap<>();
        long started = System.currentTimeMillis();
        boolean complete = false;
        try {
            for (Object item : group.getJSONArray("topics")) {
                consumer.subscribe((String) item, "*");
            }
            consumer.start();
            long deadline = started + group.getIntValue("maxSeconds") * 1000L;
            long doneAt = -1;
            while (System.currentTimeMillis() < deadline) {
                for (MessageExt message : consumer.poll(200)) {
                    messages.add(describe(message));
                    next.merge(message.getTopic() + "/" + message.getQueueId(), message.getQueueOffset() + 1, Math::max);
                }
                if (doneAt < 0 && reachedMax(bounds, next)) {
                    doneAt = System.currentTimeMillis();
                }
                if (doneAt >= 0 && System.currentTimeMillis() - doneAt >= GRACE_MILLIS) {
                    complete = true;
                    break;
                }
            }
        } finally {
            consumer.shutdown();
        }
        progress("group " + name + ": " + messages.size() + " messages, " + (complete ? "complete" : "incomplete"));
        JSONObject row = new JSONObject(true);
        row.put("group", name);
        row.put("committed", committed);
        row.put("complete", complete);
        row.put("millis", System.currentTimeMillis() - started);
        row.put("messages", messages);
        return row;
    }

    private static boolean reachedMax(Map<String, long[]> bounds, Map<String, Long> next) {
        for (Map.Entry<String, long[]> entry : bounds.entrySet()) {
            long start = entry.getValue()[0];
            long max = entry.getValue()[1];
            if (start < max && next.getOrDefault(entry.getKey(), start) < max) {
                return false;
            }
        }
        return true;
    }

    private static JSONObject describe(MessageExt message) throws Exception {
        JSONObject row = new JSONObject(true);
        row.put("topic", message.getTopic());
        row.put("queueId", message.getQueueId());
        row.put("queueOffset", message.getQueueOffset());
        row.put("commitLogOffset", message.getCommitLogOffset());
        row.put("msgId", message.getMsgId());
        row.put("offsetMsgId", message instanceof MessageClientExt
            ? ((MessageClientExt) message).getOffsetMsgId() : message.getMsgId());
        row.put("keys", message.getKeys());
        row.put("tags", message.getTags());
        row.put("storeTimestamp", message.getStoreTimestamp());
        row.put("bodySha256", sha256(message.getBody()));
        return row;
    }

    private static String sha256(byte[] body) throws Exception {
        StringBuilder hex = new StringBuilder();
        for (byte b : MessageDigest.getInstance("SHA-256").digest(body == null ? new byte[0] : body)) {
            hex.append(String.format("%02x", b));
        }
        return hex.toString();
    }
}
