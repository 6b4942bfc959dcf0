import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/** Per partition read, the cost of the calls Spark's Kafka reader makes (InternalKafkaConsumer: a consumer created and
 * assigned, seek + poll, the offset range looked up by seekToBeginning/position and seekToEnd/position, closed when the
 * consumer pool evicts it), timed call by call. Run by benchmarks/kafka_read_cost.py. Modes: "close" (a new consumer
 * per partition, as Spark's pool of 64 does over 1,000 partitions), "keep" (three rounds over kept consumers). */
public class KafkaReadCost {
  static Properties props(String bootstrap, String extra) {
    Properties p = new Properties();
    p.put("bootstrap.servers", bootstrap);
    p.put("key.deserializer", ByteArrayDeserializer.class.getName());
    p.put("value.deserializer", ByteArrayDeserializer.class.getName());
    p.put("group.id", "spark-kafka-source-cost-executor");
    p.put("enable.auto.commit", "false");
    p.put("auto.offset.reset", "none");
    p.put("receive.buffer.bytes", "65536");
    p.put("isolation.level", "read_committed");
    p.put("fetch.max.wait.ms", "1");  // kdq's (kdq.config.model.Config.spark_kafka_options)
    p.put("max.partition.fetch.bytes", "8388608");
    if (!extra.isEmpty()) for (String kv : extra.split(",")) { String[] a = kv.split("=", 2); p.put(a[0], a[1]); }
    return p;
  }
  static double ms(long a, long b) { return (b - a) / 1e6; }
  public static void main(String[] args) throws Exception {
    String bootstrap = args[0]; String prefix = args[1]; int topics = Integer.parseInt(args[2]);
    String mode = args[3]; String extra = args.length > 4 ? args[4] : "";
    int rounds = mode.equals("keep") ? 3 : 1;
    Map<TopicPartition, KafkaConsumer<byte[], byte[]>> open = new HashMap<>();
    for (int round = 0; round < rounds; round++) {
      double create = 0, poll = 0, ranges = 0, close = 0; long records = 0; int polls = 0;
      long start = System.nanoTime();
      for (int i = 0; i < topics; i++) {
        TopicPartition tp = new TopicPartition(prefix + i, 0);
        long t0 = System.nanoTime();
        KafkaConsumer<byte[], byte[]> c = open.get(tp);
        if (c == null) { c = new KafkaConsumer<>(props(bootstrap, extra)); c.assign(List.of(tp)); }
        long t1 = System.nanoTime();
        c.seek(tp, 0);
        ConsumerRecords<byte[], byte[]> r = c.poll(Duration.ofSeconds(10)); polls++;
        records += r.records(tp).size();
        c.position(tp);
        long t2 = System.nanoTime();
        c.seekToBeginning(List.of(tp)); c.position(tp); c.seekToEnd(List.of(tp)); c.position(tp);
        long t3 = System.nanoTime();
        if (mode.equals("keep")) open.put(tp, c); else c.close();
        long t4 = System.nanoTime();
        create += ms(t0, t1); poll += ms(t1, t2); ranges += ms(t2, t3); close += ms(t3, t4);
      }
      double wall = ms(start, System.nanoTime());
      System.out.printf("%s round %d: %d partitions, %d records, wall %.0f ms = %.2f ms/partition: create %.2f, seek+poll %.2f, 2 offset lookups %.2f, close %.2f (ms per partition)%n",
          mode, round, topics, records, wall, wall / topics, create / topics, poll / topics, ranges / topics, close / topics);
    }
    for (KafkaConsumer<byte[], byte[]> c : open.values()) c.close(Duration.ZERO);
  }
}
