import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONArray;
import com.alibaba.fastjson2.JSONObject;
import com.alibaba.fastjson2.JSONWriter;
import java.io.File;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import org.apache.rocketmq.common.BoundaryType;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageExtBrokerInner;
import org.apache.rocketmq.common.sysflag.MessageSysFlag;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.QueryMessageResult;
import org.apache.rocketmq.store.SelectMappedBufferResult;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.queue.ConsumeQueueInterface;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * RocketMQ's own message store (DefaultMessageStore) as a judge of rmqlake's store directories.
 *
 * <pre>
 * read  REQUEST.json   load() + start() a store directory, answer the lookups of the request, shutdown()
 * write REQUEST.json   put the request's messages with putMessage into an empty store, print them, shutdown()
 * </pre>
 *
 * The request names the store directory and its file sizes. The answer is one JSON object on the
 * last line of stdout. Bodies and raw records are base64; hosts are the hex of their stored field
 * (address bytes then the port as a 4-byte int).
 */
public class StoreHarness {

    public static void main(String[] args) throws Exception {
        if (args.length != 2 || !(args[0].equals("read") || args[0].equals("write"))) {
            System.err.println("usage: StoreHarness read|write REQUEST.json");
            System.exit(2);
        }
        JSONObject request = JSON.parseObject(new String(Files.readAllBytes(Paths.get(args[1])), StandardCharsets.UTF_8));
        Map<String, Object> answer = args[0].equals("read") ? read(request) : write(request);
        System.out.println(JSON.toJSONString(answer, JSONWriter.Feature.WriteNulls));
        System.out.flush();
        System.exit(0); // the store leaves non-daemon threads behind after shutdown()
    }

    static DefaultMessageStore open(JSONObject request) throws Exception {
        MessageStoreConfig config = new MessageStoreConfig();
        String root = request.getString("storeDir");
        config.setStorePathRootDir(root);
        config.setStorePathCommitLog(root + File.separator + "commitlog");
        config.setMappedFileSizeCommitLog(request.getIntValue("segmentSize"));
        config.setMappedFileSizeConsumeQueue(request.getIntValue("cqUnitsPerFile") * 20);
        config.setMaxHashSlotNum(request.getIntValue("indexSlots"));
        config.setMaxIndexNum(request.getIntValue("indexMaxEntries"));
        config.setHaListenPort(0); // the OS picks a free port: several stores may run at once
        // COMPACTION topics are read through the normal consume queue, which these checks compare with the lake;
        // the compaction/ files are served and checked by BrokerHarness
        config.setEnableCompaction(false);
        config.setTimerWheelEnable(false);
        config.setFileReservedTime(24 * 365 * 100); // nothing expires while the store is open
        config.setCleanFileForciblyEnable(false);
        config.setDiskMaxUsedSpaceRatio(99);
        BrokerConfig broker = new BrokerConfig();
        broker.setBrokerClusterName("DefaultCluster");
        ConcurrentMap<String, TopicConfig> topics = new ConcurrentHashMap<>();
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("interop", false), null,
            broker, topics);
        if (!store.load()) {
            throw new IllegalStateException("DefaultMessageStore.load() failed for " + root);
        }
        store.start();
        waitForDispatch(store);
        return store;
    }

    static void waitForDispatch(DefaultMessageStore store) throws InterruptedException {
        for (int i = 0; i < 600 && store.dispatchBehindBytes() > 0; i++) {
            Thread.sleep(50);
        }
        if (store.dispatchBehindBytes() > 0) {
            throw new IllegalStateException("reput still " + store.dispatchBehindBytes() + " bytes behind");
        }
    }

    // -- read -------------------------------------------------------------------------------------

    static Map<String, Object> read(JSONObject request) throws Exception {
        DefaultMessageStore store = open(request);
        Map<String, Object> answer = new LinkedHashMap<>();
        try {
            answer.put("minPhyOffset", store.getMinPhyOffset());
            answer.put("maxPhyOffset", store.getMaxPhyOffset());
            answer.put("confirmOffset", store.getCommitLog().getConfirmOffset());
            List<Object> queues = new ArrayList<>();
            TreeMap<String, TreeMap<Integer, ConsumeQueueInterface>> sorted = new TreeMap<>();
            for (Map.Entry<String, ConcurrentMap<Integer, ConsumeQueueInterface>> e : store.getConsumeQueueTable().entrySet()) {
                sorted.put(e.getKey(), new TreeMap<>(e.getValue()));
            }
            for (Map.Entry<String, TreeMap<Integer, ConsumeQueueInterface>> e : sorted.entrySet()) {
                for (Integer queueId : e.getValue().keySet()) {
                    queues.add(readQueue(store, e.getKey(), queueId));
                }
            }
            answer.put("queues", queues);

            List<Object> keyAnswers = new ArrayList<>();
            for (Object item : request.getJSONArray("keyQueries")) {
                JSONObject q = (JSONObject) item;
                QueryMessageResult result = store.queryMessage(q.getString("topic"), q.getString("key"),
                    q.getIntValue("maxNum"), q.getLongValue("begin"), q.getLongValue("end"));
                List<Object> found = new ArrayList<>();
                for (ByteBuffer buffer : result.getMessageBufferList()) {
                    found.add(describe(buffer));
                }
                result.release();
                keyAnswers.add(found);
            }
            answer.put("keyQueries", keyAnswers);

            List<Object> lookups = new ArrayList<>();
            for (Object item : request.getJSONArray("offsets")) {
                MessageExt message = store.lookMessageByOffset(((Number) item).longValue());
                lookups.add(message == null ? null : fields(message));
            }
            answer.put("lookups", lookups);

            List<Object> times = new ArrayList<>();
            for (Object item : request.getJSONArray("timeQueries")) {
                JSONObject q = (JSONObject) item;
                BoundaryType boundary = "upper".equals(q.getString("boundary")) ? BoundaryType.UPPER : BoundaryType.LOWER;
                times.add(store.getOffsetInQueueByTime(q.getString("topic"), q.getIntValue("queueId"),
                    q.getLongValue("timestamp"), boundary));
            }
            answer.put("timeQueries", times);
        } finally {
            store.shutdown();
        }
        answer.put("abortAfterShutdown", new File(request.getString("storeDir"), "abort").exists());
        String[] indexFiles = new File(request.getString("storeDir"), "index").list();
        java.util.Arrays.sort(indexFiles);
        answer.put("indexFiles", indexFiles); // after an abnormal exit, load() drops the files recovery rebuilds
        return answer;
    }

    static Map<String, Object> readQueue(DefaultMessageStore store, String topic, int queueId) throws Exception {
        Map<String, Object> queue = new LinkedHashMap<>();
        long min = store.getMinOffsetInQueue(topic, queueId);
        long max = store.getMaxOffsetInQueue(topic, queueId);
        queue.put("topic", topic);
        queue.put("queueId", queueId);
        queue.put("minOffset", min);
        queue.put("maxOffset", max);
        Map<String, Object> statuses = new LinkedHashMap<>();
        for (long probe : new long[] {min - 1, max, max + 1}) {
            if (probe < 0) {
                continue;
            }
            GetMessageResult result = store.getMessage("interop", topic, queueId, probe, 1, null);
            statuses.put(Long.toString(probe), result.getStatus().name());
            result.release();
        }
        queue.put("statuses", statuses);
        List<Object> messages = new ArrayList<>();
        long offset = min;
        while (offset < max) {
            GetMessageResult result = store.getMessage("interop", topic, queueId, offset, 32, null);
            if (result == null) {
                throw new IllegalStateException("getMessage returned null for " + topic + "/" + queueId);
            }
            for (ByteBuffer buffer : result.getMessageBufferList()) {
                messages.add(describe(buffer));
            }
            long next = result.getNextBeginOffset();
            String status = result.getStatus().name();
            result.release();
            if (next <= offset) {
                throw new IllegalStateException("getMessage " + topic + "/" + queueId + "@" + offset + ": " + status
                    + ", next " + next);
            }
            offset = next;
        }
        queue.put("messages", messages);
        return queue;
    }

    /** The raw record and every field MessageDecoder reads from it (CRC checked). */
    static Map<String, Object> describe(ByteBuffer buffer) {
        ByteBuffer copy = buffer.slice();
        byte[] raw = new byte[copy.remaining()];
        copy.get(raw);
        MessageExt message = MessageDecoder.decode(ByteBuffer.wrap(raw), true, false, false, false, true);
        if (message == null) {
            throw new IllegalStateException("MessageDecoder could not decode a record of " + raw.length + " bytes");
        }
        Map<String, Object> out = fields(message);
        out.put("raw", Base64.getEncoder().encodeToString(raw));
        return out;
    }

    static Map<String, Object> fields(MessageExt m) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("msgId", m.getMsgId());
        out.put("topic", m.getTopic());
        out.put("queueId", m.getQueueId());
        out.put("flag", m.getFlag());
        out.put("queueOffset", m.getQueueOffset());
        out.put("commitLogOffset", m.getCommitLogOffset());
        out.put("storeSize", m.getStoreSize());
        out.put("sysFlag", m.getSysFlag());
        out.put("bodyCRC", m.getBodyCRC());
        out.put("bornTimestamp", m.getBornTimestamp());
        out.put("bornHost", host(m.getBornHost()));
        out.put("storeTimestamp", m.getStoreTimestamp());
        out.put("storeHost", host(m.getStoreHost()));
        out.put("reconsumeTimes", m.getReconsumeTimes());
        out.put("preparedTransactionOffset", m.getPreparedTransactionOffset());
        out.put("body", m.getBody() == null ? null : Base64.getEncoder().encodeToString(m.getBody()));
        out.put("properties", new TreeMap<>(m.getProperties()));
        return out;
    }

    static String host(java.net.SocketAddress address) {
        InetSocketAddress socket = (InetSocketAddress) address;
        byte[] ip = socket.getAddress().getAddress();
        ByteBuffer field = ByteBuffer.allocate(ip.length + 4);
        field.put(ip).putInt(socket.getPort());
        StringBuilder hex = new StringBuilder();
        for (byte b : field.array()) {
            hex.append(String.format("%02x", b));
        }
        return hex.toString();
    }

    // -- write ------------------------------------------------------------------------------------

    static Map<String, Object> write(JSONObject request) throws Exception {
        DefaultMessageStore store = open(request);
        Map<String, Object> answer = new LinkedHashMap<>();
        List<Object> stored = new ArrayList<>();
        try {
            JSONArray messages = request.getJSONArray("messages");
            for (int i = 0; i < messages.size(); i++) {
                MessageExtBrokerInner inner = inner(messages.getJSONObject(i));
                PutMessageResult result = store.putMessage(inner);
                if (result == null || !result.isOk()) {
                    throw new IllegalStateException("putMessage #" + i + ": "
                        + (result == null ? "null" : result.getPutMessageStatus()));
                }
                Map<String, Object> put = new LinkedHashMap<>();
                put.put("wroteOffset", result.getAppendMessageResult().getWroteOffset());
                put.put("wroteBytes", result.getAppendMessageResult().getWroteBytes());
                put.put("msgId", result.getAppendMessageResult().getMsgId());
                put.put("storeTimestamp", result.getAppendMessageResult().getStoreTimestamp());
                put.put("logicsOffset", result.getAppendMessageResult().getLogicsOffset());
                stored.add(put);
                Thread.sleep(1); // index files are named by the wall clock (ms): keep two from sharing a name
            }
            waitForDispatch(store);
            for (Object item : stored) {
                @SuppressWarnings("unchecked")
                Map<String, Object> put = (Map<String, Object>) item;
                long offset = (Long) put.get("wroteOffset");
                SelectMappedBufferResult data = store.getCommitLog().getData(offset, false);
                ByteBuffer buffer = data.getByteBuffer().slice();
                buffer.limit(buffer.getInt(0));
                put.put("message", describe(buffer));
                data.release();
            }
            answer.put("minPhyOffset", store.getMinPhyOffset());
            answer.put("maxPhyOffset", store.getMaxPhyOffset());
        } finally {
            store.shutdown();
        }
        answer.put("stored", stored);
        return answer;
    }

    static MessageExtBrokerInner inner(JSONObject spec) throws Exception {
        MessageExtBrokerInner inner = new MessageExtBrokerInner();
        inner.setTopic(spec.getString("topic"));
        inner.setQueueId(spec.getIntValue("queueId"));
        inner.setBody(Base64.getDecoder().decode(spec.getString("body")));
        inner.setFlag(spec.getIntValue("flag"));
        inner.setBornTimestamp(spec.getLongValue("bornTimestamp"));
        inner.setBornHost(socket(spec.getString("bornHost")));
        inner.setStoreHost(socket(spec.getString("storeHost")));
        inner.setReconsumeTimes(spec.getIntValue("reconsumeTimes"));
        int transaction;
        switch (spec.getString("transaction")) {
            case "PREPARED": transaction = MessageSysFlag.TRANSACTION_PREPARED_TYPE; break;
            case "COMMIT": transaction = MessageSysFlag.TRANSACTION_COMMIT_TYPE; break;
            case "ROLLBACK": transaction = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE; break;
            default: transaction = MessageSysFlag.TRANSACTION_NOT_TYPE;
        }
        inner.setSysFlag(MessageSysFlag.resetTransactionValue(0, transaction));
        inner.setPreparedTransactionOffset(0);
        // the broker's map: SendMessageProcessor parses the producer's string into new HashMap<>(128)
        Map<String, String> properties = new HashMap<>(128);
        for (Object pair : spec.getJSONArray("properties")) {
            JSONArray kv = (JSONArray) pair;
            properties.put(kv.getString(0), kv.getString(1));
        }
        MessageAccessor.setProperties(inner, properties);
        inner.setPropertiesString(MessageDecoder.messageProperties2String(properties));
        inner.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(properties.get("TAGS")));
        return inner;
    }

    static InetSocketAddress socket(String text) throws Exception {
        int colon = text.lastIndexOf(':');
        String host = text.substring(0, colon);
        if (host.startsWith("[")) {
            host = host.substring(1, host.length() - 1);
        }
        return new InetSocketAddress(InetAddress.getByName(host), Integer.parseInt(text.substring(colon + 1)));
    }
}
