import java.util.*;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.rebalance.*;
import org.apache.rocketmq.common.message.MessageQueue;

public class Gold {
    static StringBuilder out = new StringBuilder();
    static boolean first = true;

    static String q(String s) { return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\""; }

    static void emit(String name, int vnodes, Collection<String> rooms, List<MessageQueue> mqs, List<String> cids, AllocateMessageQueueStrategy s) {
        mqs = new ArrayList<>(mqs); Collections.sort(mqs);
        cids = new ArrayList<>(cids); Collections.sort(cids);
        StringBuilder b = new StringBuilder();
        b.append("{\"strategy\":").append(q(name)).append(",\"vnodes\":").append(vnodes);
        b.append(",\"rooms\":[");
        int i = 0;
        if (rooms != null) for (String r : rooms) { if (i++ > 0) b.append(','); b.append(q(r)); }
        b.append("],\"queues\":[");
        for (i = 0; i < mqs.size(); i++) {
            MessageQueue m = mqs.get(i);
            if (i > 0) b.append(',');
            b.append('[').append(q(m.getTopic())).append(',').append(q(m.getBrokerName())).append(',').append(m.getQueueId()).append(']');
        }
        b.append("],\"clients\":[");
        for (i = 0; i < cids.size(); i++) { if (i > 0) b.append(','); b.append(q(cids.get(i))); }
        b.append("],\"result\":[");
        for (i = 0; i < cids.size(); i++) {
            if (i > 0) b.append(',');
            List<MessageQueue> r = s.allocate("gold-group", cids.get(i), mqs, cids);
            b.append('[');
            for (int j = 0; j < r.size(); j++) { if (j > 0) b.append(','); b.append(mqs.indexOf(r.get(j))); }
            b.append(']');
        }
        b.append("]}");
        if (!first) out.append(",\n");
        first = false;
        out.append(b);
    }

    static List<MessageQueue> queues(int n) {
        List<MessageQueue> l = new ArrayList<>();
        int half = (n + 1) / 2;
        for (int k = 0; k < n; k++) l.add(new MessageQueue("TopicTest", k < half ? "broker-a" : "broker-b", k < half ? k : k - half));
        return l;
    }

    static List<String> clients(int n, boolean ip) {
        List<String> l = new ArrayList<>();
        for (int c = 0; c < n; c++) l.add(ip ? "192.168.0." + (c * 7 % 256) + "@" + (1000 + c * 13) : "CID-" + c);
        return l;
    }

    public static void main(String[] args) {
        int[][] combos = {{1,1},{1,3},{4,4},{6,2},{6,3},{6,4},{6,7},{8,3},{10,4},{16,5},{20,10},{10,20},{33,7},{64,9},{128,16}};
        out.append("[\n");
        for (int[] c : combos) {
            for (boolean ip : new boolean[]{false, true}) {
                List<MessageQueue> mqs = queues(c[0]);
                List<String> cids = clients(c[1], ip);
                if (!ip) {
                    emit("AVG", 0, null, mqs, cids, new AllocateMessageQueueAveragely());
                    emit("AVG_BY_CIRCLE", 0, null, mqs, cids, new AllocateMessageQueueAveragelyByCircle());
                }
                emit("CONSISTENT_HASH", 10, null, mqs, cids, new AllocateMessageQueueConsistentHash());
                emit("CONSISTENT_HASH", 3, null, mqs, cids, new AllocateMessageQueueConsistentHash(3));
                emit("CONSISTENT_HASH", 1, null, mqs, cids, new AllocateMessageQueueConsistentHash(1));
            }
        }
        // Machine room, including odd broker names.
        List<MessageQueue> mr = new ArrayList<>();
        for (int k = 0; k < 5; k++) mr.add(new MessageQueue("TopicTest", "room1@broker-a", k));
        for (int k = 0; k < 5; k++) mr.add(new MessageQueue("TopicTest", "room2@broker-b", k));
        String[] odd = {"room1@broker-c@", "room1@x@y", "room1@", "@broker-d", "nobroker", "room2@@", "@"};
        for (String b : odd) for (int k = 0; k < 2; k++) mr.add(new MessageQueue("TopicTest", b, k));
        List<List<String>> roomSets = Arrays.asList(Arrays.asList("room1"), Arrays.asList("room1", "room2"), Arrays.asList("", "room2"), Arrays.asList("nobody"));
        for (List<String> rooms : roomSets) {
            for (int nc = 1; nc <= 6; nc++) {
                AllocateMessageQueueByMachineRoom s = new AllocateMessageQueueByMachineRoom();
                s.setConsumeridcs(new HashSet<>(rooms));
                emit("MACHINE_ROOM", 0, rooms, mr, clients(nc, false), s);
            }
        }
        // The documented vector.
        {
            AllocateMessageQueueByMachineRoom s = new AllocateMessageQueueByMachineRoom();
            s.setConsumeridcs(new HashSet<>(Arrays.asList("room1")));
            emit("MACHINE_ROOM", 0, Arrays.asList("room1"), mr.subList(0, 10), clients(2, false), s);
        }
        // Machine room nearby: broker room = part before '@', client room = part before '-'.
        AllocateMachineRoomNearby.MachineRoomResolver res = new AllocateMachineRoomNearby.MachineRoomResolver() {
            public String brokerDeployIn(MessageQueue mq) { return mq.getBrokerName().split("@")[0]; }
            public String consumerDeployIn(String cid) { return cid.split("-")[0]; }
        };
        List<MessageQueue> nb = new ArrayList<>();
        String[] brokers = {"hz@broker-a", "sh@broker-b", "bj@broker-c", "gz@broker-d"};
        int[] per = {4, 5, 3, 7};
        for (int b = 0; b < brokers.length; b++) for (int k = 0; k < per[b]; k++) nb.add(new MessageQueue("TopicTest", brokers[b], k));
        String[][] groups = {{"hz-c0"}, {"hz-c0", "sh-c1"}, {"hz-c0", "hz-c1", "sh-c2"}, {"hz-c0", "hz-c1", "hz-c2", "sh-c0", "sh-c1", "cd-c0"}, {"cd-c0", "cd-c1"}, {"bj-c0", "gz-c0", "hz-c0", "sh-c0"}};
        for (String[] g : groups) {
            List<String> cids = Arrays.asList(g);
            emit("MACHINE_ROOM_NEARBY-AVG", 0, null, nb, cids, new AllocateMachineRoomNearby(new AllocateMessageQueueAveragely(), res));
            emit("MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE", 0, null, nb, cids, new AllocateMachineRoomNearby(new AllocateMessageQueueAveragelyByCircle(), res));
            emit("MACHINE_ROOM_NEARBY-CONSISTENT_HASH", 10, null, nb, cids, new AllocateMachineRoomNearby(new AllocateMessageQueueConsistentHash(), res));
        }
        out.append("\n]\n");
        System.out.print(out);
    }
}
