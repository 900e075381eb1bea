package bench;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The share-group peer of the benchmark suite: one {@link KafkaShareConsumer} (KIP-932) that
 * acknowledges every record explicitly, the closest thing Kafka itself offers to per-message
 * acknowledgement with redelivery.
 *
 * <p>Usage: {@code ShareConsumerBench BROKERS TOPIC GROUP TARGET LIMIT_S LATENCIES_FILE
 * MAX_POLL [WARM_UP_TOPIC WARM_UP_RECORDS]}. A TARGET of -1 means "read it from stdin later"
 * (the latency runs learn how many records were offered only when the load stops); MAX_POLL is
 * {@code max.poll.records}. It speaks
 * a line protocol with the Rust harness on stdout: {@code first} once the first record was
 * handed to the application, then {@code done RECEIVED ELAPSED_MS CPU_MS MARK STEADY_MS} at the
 * end (STEADY_MS: from the MARKth record, a fifth of the target, to the end; -1 when the target
 * was not known at the start). ELAPSED_MS
 * runs from creating the consumer (as the suite times every kind from subscribing; JVM start-up
 * is not in it), CPU_MS from the first record (so class loading is not charged to the consumer).
 * Latencies (record creation time to handout, in ms) go to LATENCIES_FILE, one per line.
 *
 * <p>With WARM_UP_TOPIC, the peer first consumes and acknowledges WARM_UP_RECORDS records of that
 * topic (in a share group of its own) and only then starts the timed part: a JVM compiles its
 * hot code during its first seconds, which a consumer in service did long ago, and the suite
 * measured half of a fresh peer's CPU going to its JIT compiler.
 */
public final class ShareConsumerBench {
  private ShareConsumerBench() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 7 && args.length != 9) {
      System.err.println(
          "usage: ShareConsumerBench BROKERS TOPIC GROUP TARGET LIMIT_S LATENCIES_FILE MAX_POLL"
              + " [WARM_UP_TOPIC WARM_UP_RECORDS]");
      System.exit(2);
    }
    String brokers = args[0];
    String topic = args[1];
    String group = args[2];
    AtomicLong target = new AtomicLong(Long.parseLong(args[3]));
    long limitMs = Long.parseLong(args[4]) * 1000;
    Path latencies = Path.of(args[5]);
    String maxPoll = args[6];
    if (target.get() < 0) {
      target.set(Long.MAX_VALUE);
      Thread reader = new Thread(() -> readTarget(target), "target-reader");
      reader.setDaemon(true);
      reader.start();
    }
    if (args.length == 9) {
      warmUp(brokers, args[7], group + "-warm-up", Long.parseLong(args[8]), maxPoll, limitMs);
    }
    startFromEarliest(brokers, group);
    Properties props = consumerProps(brokers, group, maxPoll);
    long[] lat = new long[1 << 16];
    int n = 0;
    long started = System.currentTimeMillis();
    // The steady part, as the suite measures every kind: from the record at a fifth of a known
    // target to the end.
    long mark = target.get() == Long.MAX_VALUE ? -1 : target.get() / 5;
    long markAt = -1;
    long first = -1;
    long cpuAtFirst = 0;
    try (KafkaShareConsumer<byte[], byte[]> consumer =
        new KafkaShareConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
      consumer.subscribe(List.of(topic));
      while (n < target.get() && System.currentTimeMillis() - started < limitMs) {
        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
        for (ConsumerRecord<byte[], byte[]> r : records) {
          long now = System.currentTimeMillis();
          if (first < 0) {
            first = now;
            cpuAtFirst = cpuNanos();
            System.out.println("first");
            System.out.flush();
          }
          if (n == lat.length) {
            lat = Arrays.copyOf(lat, lat.length * 2);
          }
          lat[n++] = Math.max(0, now - r.timestamp());
          if (n == mark) {
            markAt = now;
          }
          consumer.acknowledge(r, AcknowledgeType.ACCEPT);
        }
      }
      // Acknowledgements ride on the next fetch; make the last ones durable before the clock
      // stops, as ours waits for its End markers.
      consumer.commitSync(Duration.ofSeconds(30));
    }
    // From creating the consumer, as the suite times every kind from subscribing.
    long end = System.currentTimeMillis();
    long elapsed = first < 0 ? 0 : end - started;
    long steadyMs = markAt < 0 ? -1 : end - markAt;
    long cpuMs = first < 0 ? 0 : (cpuNanos() - cpuAtFirst) / 1_000_000;
    try (BufferedWriter w = Files.newBufferedWriter(latencies, StandardCharsets.UTF_8)) {
      for (int i = 0; i < n; i++) {
        w.write(Long.toString(lat[i]));
        w.newLine();
      }
    }
    System.out.println("done " + n + " " + elapsed + " " + cpuMs + " " + mark + " " + steadyMs);
    System.out.flush();
  }

  /** The share consumer's settings, the same for the warm-up and the timed part. */
  private static Properties consumerProps(String brokers, String group, String maxPoll) {
    Properties props = new Properties();
    props.put("bootstrap.servers", brokers);
    props.put("group.id", group);
    // Every record is acknowledged by the application, one by one, as with ours.
    props.put("share.acknowledgement.mode", "explicit");
    // The batch the suite's other consumers take per poll (share groups default to 500).
    props.put("max.poll.records", maxPoll);
    return props;
  }

  /**
   * Consumes and acknowledges {@code records} records of {@code topic}, as the timed part does,
   * so that the JVM has compiled that code before the clock starts. Gives up after {@code
   * limitMs}; the timed part then runs on a JVM less warm, which the harness's JIT figure shows.
   */
  private static void warmUp(
      String brokers, String topic, String group, long records, String maxPoll, long limitMs)
      throws Exception {
    startFromEarliest(brokers, group);
    long started = System.currentTimeMillis();
    long n = 0;
    try (KafkaShareConsumer<byte[], byte[]> consumer =
        new KafkaShareConsumer<>(
            consumerProps(brokers, group, maxPoll),
            new ByteArrayDeserializer(),
            new ByteArrayDeserializer())) {
      consumer.subscribe(List.of(topic));
      while (n < records && System.currentTimeMillis() - started < limitMs) {
        for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
          n++;
          consumer.acknowledge(r, AcknowledgeType.ACCEPT);
        }
      }
      consumer.commitSync(Duration.ofSeconds(30));
    }
    if (n < records) {
      System.err.println("share peer: warm-up consumed " + n + " of " + records + " records");
    }
  }

  /** A share group starts at the latest offset by default; the suite preloads records first. */
  private static void startFromEarliest(String brokers, String group) throws Exception {
    Properties props = new Properties();
    props.put("bootstrap.servers", brokers);
    try (Admin admin = Admin.create(props)) {
      ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
      AlterConfigOp op =
          new AlterConfigOp(
              new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET);
      admin.incrementalAlterConfigs(Map.of(resource, List.of(op))).all().get();
    }
  }

  /** CPU time of the whole JVM process (all threads), in nanoseconds. */
  private static long cpuNanos() {
    var os = java.lang.management.ManagementFactory.getOperatingSystemMXBean();
    if (os instanceof com.sun.management.OperatingSystemMXBean sun) {
      return sun.getProcessCpuTime();
    }
    return 0;
  }

  private static void readTarget(AtomicLong target) {
    try (BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      String line = in.readLine();
      if (line != null) {
        target.set(Long.parseLong(line.trim()));
      }
    } catch (Exception e) {
      System.err.println("share peer: cannot read the target from stdin: " + e);
    }
  }
}
