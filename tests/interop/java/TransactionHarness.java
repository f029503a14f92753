import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.topic.TopicValidator;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageStore;

/**
 * A real RocketMQ broker receiving transactional sends from a real {@link TransactionMQProducer}
 * whose local transaction commits some, rolls back some and leaves the rest unknown (open).
 *
 * <p>Usage: {@code TransactionHarness SPEC.json}; the answer is one JSON object on the last line of
 * stdout. The store directory must be empty but for {@code config/topics.json}; the broker is shut
 * down cleanly before the answer is printed, so the caller reads its files afterwards.
 *
 * <pre>
 * {"store": "...", "work": "...", "cluster": "DefaultCluster", "timeoutSeconds": 90,
 *  "commitlogSegmentSize": 65536, "cqUnitsPerFile": 16, "indexSlots": 64, "indexMaxEntries": 200,
 *  "producerGroup": "pg_tx", "opBatchIntervalMillis": 500,
 *  "sends": [{"topic": "T", "body": "utf-8 text", "tags": "TagA", "keys": "k1 k2",
 *             "properties": {"color": "red"}, "end": "COMMIT"}, ...],
 *  "settleMillis": 500}
 * </pre>
 *
 * <p>{@code end} is what the local transaction answers: {@code COMMIT}, {@code ROLLBACK} or
 * {@code UNKNOWN} (the producer then sends no end the broker acts on). The broker's check-back is
 * kept away from the test: its service is stopped once the broker has started, the transaction
 * timeout is an hour and the producer's check answers unknown. The producer picks the queues (round robin). After the
 * sends the harness waits until every commit is on its real topic and the op records name every
 * ended half (the broker writes them in batches, {@code opBatchIntervalMillis} apart), then
 * {@code settleMillis} longer to catch anything extra. The answer lists each send's result and
 * the queues' offsets.
 */
public class TransactionHarness {

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable failure) {
            failure.printStackTrace();
            System.exit(1);
        }
        System.exit(0);  // client and broker leave non-daemon threads behind
    }

    private static void run(String[] args) throws Exception {
        JSONObject spec = JSON.parseObject(new String(Files.readAllBytes(Paths.get(args[0])), StandardCharsets.UTF_8));
        String work = spec.getString("work");
        BrokerHarness.startWatchdog(spec.getIntValue("timeoutSeconds"));
        System.setProperty("rocketmq.client.logRoot", work + File.separator + "client-logs");
        System.setProperty(RemotingCommand.REMOTING_VERSION_KEY, Integer.toString(MQVersion.CURRENT_VERSION));
        JSONObject result = new JSONObject(true);
        result.put("rocketmqVersion", MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION));
        NamesrvController namesrv = null;
        BrokerController broker = null;
        TransactionMQProducer producer = null;
        try {
            int namesrvPort = BrokerHarness.freePorts(0);
            namesrv = BrokerHarness.startNamesrv(work, namesrvPort);
            String namesrvAddr = "127.0.0.1:" + namesrvPort;
            broker = BrokerHarness.startBroker(spec, namesrvAddr, BrokerHarness.freePorts(2));
            // no check-back: its first round (30 s after start) would re-put a half carrying
            // CHECK_IMMUNITY_TIME_IN_SECONDS, and one past the timeout would ask the producer
            broker.getBrokerConfig().setTransactionTimeOut(3600 * 1000L);
            broker.getTransactionalMessageCheckService().shutdown();
            broker.getBrokerConfig().setTransactionOpBatchInterval(spec.getIntValue("opBatchIntervalMillis"));
            result.put("brokerAddr", broker.getBrokerAddr());
            result.put("brokerName", broker.getBrokerConfig().getBrokerName());
            Map<String, Boolean> topics = new TreeMap<>();
            for (Object item : spec.getJSONArray("sends")) {
                topics.put(((JSONObject) item).getString("topic"), true);
            }
            BrokerHarness.waitForTopics(namesrv, topics.keySet(), 30);
            producer = new TransactionMQProducer(spec.getString("producerGroup"));
            producer.setNamesrvAddr(namesrvAddr);
            producer.setInstanceName("rmqlake-transaction");
            producer.setClientIP("127.0.0.1");
            producer.setSendMsgTimeout(10000);
            producer.setRetryTimesWhenSendFailed(0);
            producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);  // bodies are stored as sent
            producer.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message message, Object end) {
                    switch ((String) end) {
                        case "COMMIT":
                            return LocalTransactionState.COMMIT_MESSAGE;
                        case "ROLLBACK":
                            return LocalTransactionState.ROLLBACK_MESSAGE;
                        default:
                            return LocalTransactionState.UNKNOW;
                    }
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt message) {
                    return LocalTransactionState.UNKNOW;  // open halves stay open
                }
            });
            producer.start();
            JSONArray sends = new JSONArray();
            int commits = 0;
            int ended = 0;
            for (Object item : spec.getJSONArray("sends")) {
                JSONObject send = (JSONObject) item;
                sends.add(send(producer, send));
                String end = send.getString("end");
                commits += "COMMIT".equals(end) ? 1 : 0;
                ended += "COMMIT".equals(end) || "ROLLBACK".equals(end) ? 1 : 0;
            }
            result.put("sends", sends);
            BrokerHarness.progress("sent " + sends.size() + " transactional messages");
            result.put("settled", awaitEnds(broker, topics.keySet(), commits, ended, spec));
            Thread.sleep(spec.getLongValue("settleMillis"));
            result.put("queues", queues(broker));
        } finally {
            if (producer != null) {
                producer.shutdown();
            }
            if (broker != null) {
                broker.shutdown();
            }
            if (namesrv != null) {
                namesrv.shutdown();
            }
        }
        System.out.println();
        System.out.println(JSON.toJSONString(result));
        System.out.flush();
    }

    private static JSONObject send(TransactionMQProducer producer, JSONObject spec) throws Exception {
        Message message = new Message(spec.getString("topic"), spec.getString("body").getBytes(StandardCharsets.UTF_8));
        if (spec.containsKey("tags")) {
            message.setTags(spec.getString("tags"));
        }
        if (spec.containsKey("keys")) {
            message.setKeys(spec.getString("keys"));
        }
        JSONObject properties = spec.getJSONObject("properties");
        if (properties != null) {
            for (Map.Entry<String, Object> entry : properties.entrySet()) {
                MessageAccessor.putProperty(message, entry.getKey(), String.valueOf(entry.getValue()));
            }
        }
        JSONObject row = new JSONObject(true);
        row.put("sentAt", System.currentTimeMillis());
        TransactionSendResult sent = producer.sendMessageInTransaction(message, spec.getString("end"));
        row.put("status", sent.getSendStatus().name());
        row.put("localState", sent.getLocalTransactionState().name());
        row.put("msgId", sent.getMsgId());
        row.put("transactionId", sent.getTransactionId());
        row.put("queueId", sent.getMessageQueue().getQueueId());
        row.put("queueOffset", sent.getQueueOffset());
        return row;
    }

    /** Whether every commit reached its topic and every ended half is named by an op record, in time. */
    private static boolean awaitEnds(BrokerController broker, Iterable<String> topics, int commits, int ended,
        JSONObject spec) throws Exception {
        MessageStore store = broker.getMessageStore();
        long deadline = System.currentTimeMillis() + spec.getIntValue("timeoutSeconds") * 1000L / 2;
        while (System.currentTimeMillis() < deadline) {
            long held = 0;
            for (String topic : topics) {
                int count = broker.getTopicConfigManager().selectTopicConfig(topic).getReadQueueNums();
                for (int queue = 0; queue < count; queue++) {
                    held += store.getMaxOffsetInQueue(topic, queue);
                }
            }
            if (held >= commits && opOffsets(store) >= ended) {
                return true;
            }
            Thread.sleep(100);
        }
        return false;
    }

    /** How many half offsets the op records name so far (bodies are "offset," repeated). */
    private static int opOffsets(MessageStore store) throws Exception {
        String topic = TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC;
        long max = store.getMaxOffsetInQueue(topic, 0);
        int named = 0;
        for (long offset = 0; offset < max; offset++) {
            GetMessageResult got = store.getMessage("rmqlake_harness", topic, 0, offset, 1, null);
            if (got == null || got.getMessageBufferList().isEmpty()) {
                if (got != null) {
                    got.release();
                }
                continue;
            }
            try {
                MessageExt op = org.apache.rocketmq.common.message.MessageDecoder.decode(got.getMessageBufferList().get(0));
                for (String part : new String(op.getBody(), StandardCharsets.UTF_8).split(",")) {
                    named += part.isEmpty() ? 0 : 1;
                }
            } finally {
                got.release();
            }
        }
        return named;
    }

    private static JSONArray queues(BrokerController broker) throws Exception {
        DefaultMessageStore store = (DefaultMessageStore) broker.getMessageStore();
        JSONArray rows = new JSONArray();
        for (String topic : new TreeMap<>(store.getConsumeQueueTable()).keySet()) {
            for (Integer queue : new TreeMap<>(store.getConsumeQueueTable().get(topic)).keySet()) {
                JSONObject row = new JSONObject(true);
                row.put("topic", topic);
                row.put("queueId", queue);
                row.put("minOffset", store.getMinOffsetInQueue(topic, queue));
                row.put("maxOffset", store.getMaxOffsetInQueue(topic, queue));
                rows.add(row);
            }
        }
        return rows;
    }
}
