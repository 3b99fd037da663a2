import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.common.errors.PolicyViolationException;
import org.apache.kafka.server.policy.CreateTopicPolicy;

/**
 * A destination's partition limit for kmirror's tests: stock Kafka has no
 * cluster-wide cap (KIP-578 was not adopted), so managed services enforce
 * one with a create.topic.policy.class.name plugin like this one. It
 * refuses a topic whose partitions would take the user topics' total past
 * kmirror.test.partition.limit (internal "__" topics are not counted).
 * The count lives in this controller's memory: enough for a one-node
 * test cluster whose topics are only ever created.
 */
public class PartitionLimitPolicy implements CreateTopicPolicy {
    private static final AtomicInteger USED = new AtomicInteger();
    private int limit = Integer.MAX_VALUE;

    @Override
    public void configure(Map<String, ?> configs) {
        Object v = configs.get("kmirror.test.partition.limit");
        if (v != null) {
            limit = Integer.parseInt(v.toString());
        }
    }

    @Override
    public void validate(RequestMetadata request) throws PolicyViolationException {
        if (request.topic().startsWith("__")) {
            return;
        }
        int n = request.numPartitions() != null ? request.numPartitions() : request.replicasAssignments().size();
        while (true) {
            int used = USED.get();
            if (used + n > limit) {
                throw new PolicyViolationException("partition limit reached: " + used + " of " + limit
                    + " partitions in use, topic " + request.topic() + " needs " + n);
            }
            if (USED.compareAndSet(used, used + n)) {
                return;
            }
        }
    }

    @Override
    public void close() {
    }
}
