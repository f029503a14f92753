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
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.store.DefaultMessageStore;

/**
 * A real RocketMQ broker receiving sends from a real producer, delay-level and timer messages among
 * them, and running until its scheduled-message services have delivered what came due.
 *
 * <p>Usage: {@code ScheduleHarness SPEC.json}; the answer is one JSON object on the last line of
 * stdout. The store directory must be empty but for {@code config/topics.json} (the topics to send
 * to); the broker is shut down cleanly before the answer is printed, so the caller reads its files
 * (commitlog, consumequeue, config/delayOffset.json, timerlog, timerwheel, timercheck) afterwards.
 *
 * <pre>
 * {"store": "...", "work": "...", "cluster": "DefaultCluster", "timeoutSeconds": 120,
 *  "commitlogSegmentSize": 65536, "cqUnitsPerFile": 16, "indexSlots": 64, "indexMaxEntries": 200,
 *  "messageDelayLevel": "1s 2s 3s", "timerMaxDelaySec": 259200, "timerLogFileSize": 1048576,
 *  "sends": [{"topic": "T", "queueId": 1, "body": "utf-8 text", "tags": "TagA", "keys": "k1 k2",
 *             "properties": {"TIMER_DELAY_SEC": "2", "color": "red"}, "delayLevel": 2,
 *             "deliverInMs": 3000, "deliverOnSecond": false}, ...],
 *  "expectMessages": {"T": 12}, "settleMillis": 1500}
 * </pre>
 *
 * <p>{@code properties} are put as they are (system ones such as {@code TIMER_DELAY_SEC} included);
 * {@code delayLevel} is the client's {@code setDelayTimeLevel}; {@code deliverInMs} sets
 * {@code TIMER_DELIVER_MS} to the producer's clock plus that many ms at send time (rounded up to the
 * next whole second with {@code deliverOnSecond}). Sends go one by
 * one, synchronously, to the given queue. Then the harness waits until each topic of
 * {@code expectMessages} holds that many messages (the sum of its queues' max offsets: the plain
 * sends plus the deliveries), then {@code settleMillis} longer to catch anything extra. The answer
 * lists each send's result (or the broker's error code and remark) and the queues' offsets.
 */
public class ScheduleHarness {

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
        DefaultMQProducer producer = null;
        try {
            int namesrvPort = BrokerHarness.freePorts(0);
            namesrv = BrokerHarness.startNamesrv(work, namesrvPort);
            String namesrvAddr = "127.0.0.1:" + namesrvPort;
            broker = BrokerHarness.startBroker(spec, namesrvAddr, BrokerHarness.freePorts(2));
            result.put("brokerAddr", broker.getBrokerAddr());
            result.put("brokerName", broker.getBrokerConfig().getBrokerName());
            Map<String, Boolean> topics = new TreeMap<>();
            for (Object item : spec.getJSONArray("sends")) {
                topics.put(((JSONObject) item).getString("topic"), true);
            }
            BrokerHarness.waitForTopics(namesrv, topics.keySet(), 30);
            producer = new DefaultMQProducer("rmqlake_schedule_producer");
            producer.setNamesrvAddr(namesrvAddr);
            producer.setInstanceName("rmqlake-schedule");
            producer.setClientIP("127.0.0.1");
            producer.setSendMsgTimeout(10000);
            producer.setRetryTimesWhenSendFailed(0);
            producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);  // bodies are stored as sent
            producer.start();
            JSONArray sends = new JSONArray();
            for (Object item : spec.getJSONArray("sends")) {
                sends.add(send(producer, broker.getBrokerConfig().getBrokerName(), (JSONObject) item));
            }
            result.put("sends", sends);
            BrokerHarness.progress("sent " + sends.size() + " messages");
            result.put("delivered", BrokerHarness.awaitMessages(broker, spec));
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

    private static JSONObject send(DefaultMQProducer producer, String brokerName, JSONObject spec) throws Exception {
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
        if (spec.containsKey("delayLevel")) {
            message.setDelayTimeLevel(spec.getIntValue("delayLevel"));
        }
        JSONObject row = new JSONObject(true);
        long sentAt = System.currentTimeMillis();
        if (spec.containsKey("deliverInMs")) {
            long deliverAt = sentAt + spec.getLongValue("deliverInMs");
            if (spec.getBooleanValue("deliverOnSecond")) {
                deliverAt = (deliverAt / 1000 + 1) * 1000;  // a whole second: the rounding's other branch
            }
            String deliverMs = Long.toString(deliverAt);
            MessageAccessor.putProperty(message, MessageConst.PROPERTY_TIMER_DELIVER_MS, deliverMs);
            row.put("deliverMs", deliverMs);
        }
        row.put("sentAt", sentAt);
        try {
            SendResult sent = producer.send(message, new MessageQueue(spec.getString("topic"), brokerName,
                spec.getIntValue("queueId")));
            row.put("status", sent.getSendStatus().name());
            row.put("msgId", sent.getMsgId());
            row.put("offsetMsgId", sent.getOffsetMsgId());
            row.put("queueId", sent.getMessageQueue().getQueueId());
            row.put("queueOffset", sent.getQueueOffset());
        } catch (MQBrokerException refused) {
            row.put("status", "REFUSED");
            row.put("responseCode", refused.getResponseCode());
            row.put("remark", refused.getErrorMessage());
        }
        return row;
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
