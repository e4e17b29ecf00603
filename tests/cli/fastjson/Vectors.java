// The reference bytes of tests/cli/test_admin_bodies.py: RocketMQ 4.9.8's admin body classes,
// filled from vectors.json's inputs the way AdminBrokerProcessor fills them, encoded by
// fastjson 1.2.69 (RemotingSerializable.encode), written back as each vector's "expected".
//
//   javac -cp FASTJSON:ROCKETMQ_COMMON Vectors.java && java -cp FASTJSON:ROCKETMQ_COMMON:. Vectors vectors.json
//
// FASTJSON: com.alibaba:fastjson:1.2.69 (RocketMQ 4.9.8 pins 1.2.69_noneautotype); ROCKETMQ_COMMON:
// the classes of rocketmq-common and RemotingSerializable/LanguageCode of rocketmq-remoting 4.9.8.
import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.*;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.admin.*;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.body.*;
import org.apache.rocketmq.common.protocol.header.GetConsumerListByGroupResponseBody;
import org.apache.rocketmq.common.protocol.heartbeat.*;
import org.apache.rocketmq.remoting.protocol.LanguageCode;

public class Vectors {
    static ConsumeStats consumeStats(JSONObject in) {
        ConsumeStats cs = new ConsumeStats();
        for (Object o : in.getJSONArray("rows")) {
            JSONObject r = (JSONObject) o;
            OffsetWrapper w = new OffsetWrapper();
            w.setBrokerOffset(r.getLongValue("brokerOffset"));
            w.setConsumerOffset(r.getLongValue("consumerOffset"));
            w.setLastTimestamp(r.getLongValue("lastTimestamp"));
            cs.getOffsetTable().put(new MessageQueue(r.getString("topic"), r.getString("brokerName"), r.getIntValue("queueId")), w);
        }
        cs.setConsumeTps(in.getDoubleValue("consumeTps"));
        return cs;
    }

    static Connection connection(JSONObject c) {
        Connection conn = new Connection();
        conn.setClientId(c.getString("clientId"));
        conn.setClientAddr(c.getString("clientAddr"));
        conn.setLanguage(LanguageCode.valueOf(c.getString("language")));
        conn.setVersion(c.getIntValue("version"));
        return conn;
    }

    static SubscriptionData subscription(JSONObject s) {
        SubscriptionData sd = new SubscriptionData();
        sd.setTopic(s.getString("topic"));
        sd.setSubString(s.getString("subString"));
        for (Object t : s.getJSONArray("tags")) {
            sd.getTagsSet().add((String) t);
            sd.getCodeSet().add(((String) t).hashCode());
        }
        sd.setSubVersion(s.getLongValue("subVersion"));
        return sd;
    }

    static byte[] encode(String body, JSONObject in) {
        switch (body) {
            case "ConsumeStats":
                return consumeStats(in).encode();
            case "TopicStatsTable": {
                TopicStatsTable t = new TopicStatsTable();
                for (Object o : in.getJSONArray("rows")) {
                    JSONObject r = (JSONObject) o;
                    TopicOffset off = new TopicOffset();
                    off.setMinOffset(r.getLongValue("minOffset"));
                    off.setMaxOffset(r.getLongValue("maxOffset"));
                    off.setLastUpdateTimestamp(r.getLongValue("lastUpdateTimestamp"));
                    t.getOffsetTable().put(new MessageQueue(r.getString("topic"), r.getString("brokerName"), r.getIntValue("queueId")), off);
                }
                return t.encode();
            }
            case "ConsumeStatsList": {
                ConsumeStatsList l = new ConsumeStatsList();
                l.setBrokerAddr(in.getString("brokerAddr"));
                l.setTotalDiff(in.getLongValue("totalDiff"));
                for (Object o : in.getJSONArray("groups")) {
                    JSONArray g = (JSONArray) o;
                    List<ConsumeStats> stats = new ArrayList<ConsumeStats>();
                    for (Object s : g.getJSONArray(1)) {
                        stats.add(consumeStats((JSONObject) s));
                    }
                    Map<String, List<ConsumeStats>> m = new HashMap<String, List<ConsumeStats>>();
                    m.put(g.getString(0), stats);
                    l.getConsumeStatsList().add(m);
                }
                return l.encode();
            }
            case "ConsumerConnection": {
                ConsumerConnection cc = new ConsumerConnection();
                for (Object c : in.getJSONArray("conns")) {
                    cc.getConnectionSet().add(connection((JSONObject) c));
                }
                for (Object s : in.getJSONArray("subs")) {
                    SubscriptionData sd = subscription((JSONObject) s);
                    cc.getSubscriptionTable().put(sd.getTopic(), sd);
                }
                cc.setConsumeType(ConsumeType.valueOf(in.getString("consumeType")));
                cc.setMessageModel(MessageModel.valueOf(in.getString("messageModel")));
                cc.setConsumeFromWhere(ConsumeFromWhere.valueOf(in.getString("consumeFromWhere")));
                return cc.encode();
            }
            case "ProducerConnection": {
                ProducerConnection pc = new ProducerConnection();
                for (Object c : in.getJSONArray("conns")) {
                    pc.getConnectionSet().add(connection((JSONObject) c));
                }
                return pc.encode();
            }
            case "KVTable": {
                HashMap<String, String> m = new HashMap<String, String>(in.getIntValue("capacity"));
                for (Object o : in.getJSONArray("table")) {
                    JSONArray kv = (JSONArray) o;
                    m.put(kv.getString(0), kv.getString(1));
                }
                KVTable t = new KVTable();
                t.setTable(m);
                return t.encode();
            }
            case "BrokerStatsData": {
                BrokerStatsData d = new BrokerStatsData();
                BrokerStatsItem[] items = new BrokerStatsItem[3];
                String[] names = {"statsMinute", "statsHour", "statsDay"};
                for (int i = 0; i < 3; i++) {
                    JSONObject s = in.getJSONObject(names[i]);
                    items[i] = new BrokerStatsItem();
                    items[i].setSum(s.getLongValue("sum"));
                    items[i].setTps(s.getDoubleValue("tps"));
                    items[i].setAvgpt(s.getDoubleValue("avgpt"));
                }
                d.setStatsMinute(items[0]);
                d.setStatsHour(items[1]);
                d.setStatsDay(items[2]);
                return d.encode();
            }
            case "GroupList": {
                HashSet<String> groups = new HashSet<String>();
                for (Object g : in.getJSONArray("groups")) {
                    groups.add((String) g);
                }
                GroupList gl = new GroupList();
                gl.setGroupList(groups);
                return gl.encode();
            }
            case "LockBatchResponseBody": {
                LockBatchResponseBody b = new LockBatchResponseBody();
                for (Object o : in.getJSONArray("mqs")) {
                    JSONObject m = (JSONObject) o;
                    b.getLockOKMQSet().add(new MessageQueue(m.getString("topic"), m.getString("brokerName"), m.getIntValue("queueId")));
                }
                return b.encode();
            }
            case "QueryConsumeQueueResponseBody": {
                QueryConsumeQueueResponseBody b = new QueryConsumeQueueResponseBody();
                b.setMinQueueIndex(in.getLongValue("min"));
                b.setMaxQueueIndex(in.getLongValue("max"));
                if (in.get("sub") != null) {
                    b.setSubscriptionData(subscription(in.getJSONObject("sub")));
                }
                b.setFilterData(in.getString("filterData"));
                if (in.get("entries") != null) {
                    List<ConsumeQueueData> q = new ArrayList<ConsumeQueueData>();
                    for (Object o : in.getJSONArray("entries")) {
                        JSONArray e = (JSONArray) o;
                        ConsumeQueueData d = new ConsumeQueueData();
                        d.setPhysicOffset(e.getLongValue(0));
                        d.setPhysicSize(e.getIntValue(1));
                        d.setTagsCode(e.getLongValue(2));
                        q.add(d);
                    }
                    b.setQueueData(q);
                }
                return b.encode();
            }
            case "GetConsumerListByGroupResponseBody": {
                GetConsumerListByGroupResponseBody b = new GetConsumerListByGroupResponseBody();
                List<String> ids = new ArrayList<String>();
                for (Object o : in.getJSONArray("ids")) {
                    ids.add((String) o);
                }
                b.setConsumerIdList(ids);
                return b.encode();
            }
            default:
                throw new IllegalArgumentException(body);
        }
    }

    public static void main(String[] args) throws Exception {
        String path = args[0];
        JSONArray vectors = JSON.parseArray(new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.UTF_8));
        for (Object o : vectors) {
            JSONObject v = (JSONObject) o;
            v.put("expected", new String(encode(v.getString("body"), v.getJSONObject("input")), StandardCharsets.UTF_8));
        }
        Files.write(Paths.get(path), JSON.toJSONString(vectors, SerializerFeature.PrettyFormat).getBytes(StandardCharsets.UTF_8));
    }
}
