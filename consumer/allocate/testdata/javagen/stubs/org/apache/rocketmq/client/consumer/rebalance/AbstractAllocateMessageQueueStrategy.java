package org.apache.rocketmq.client.consumer.rebalance;

import java.util.List;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.common.message.MessageQueue;

// Stand-in without logging/commons deps: same checks.
public abstract class AbstractAllocateMessageQueueStrategy implements AllocateMessageQueueStrategy {
    public boolean check(String consumerGroup, String currentCID, List<MessageQueue> mqAll, List<String> cidAll) {
        if (currentCID == null || currentCID.isEmpty()) throw new IllegalArgumentException("currentCID is empty");
        if (mqAll == null || mqAll.isEmpty()) throw new IllegalArgumentException("mqAll is null or mqAll empty");
        if (cidAll == null || cidAll.isEmpty()) throw new IllegalArgumentException("cidAll is null or cidAll empty");
        return cidAll.contains(currentCID);
    }
}
