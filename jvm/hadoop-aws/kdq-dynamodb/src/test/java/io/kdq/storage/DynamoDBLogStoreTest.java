package io.kdq.storage;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.delta.storage.CloseableIterator;
import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import software.amazon.awssdk.services.dynamodb.model.AttributeValue;
import software.amazon.awssdk.services.dynamodb.model.DynamoDbException;

/**
 * kdq's DynamoDB log store on the local file system with DynamoDB in memory ({@link InMemoryDynamoDb}); each store
 * instance stands for one driver. What is checked, as Delta's own S3DynamoDBLogStore behaves:
 *
 * <ul>
 *   <li>once a writer's claim of version N is in DynamoDB, N is decided: a failure of its copy to N.json or of its
 *       completion is logged, not thrown (the caller would report a failure for a commit that a reader then
 *       completes), and the next reader or writer finishes it;
 *   <li>a writer that dies between its claim and its completion: a later reader (listFrom) or writer copies the
 *       temporary file to N.json and completes the item; no commit lost, no version written twice;
 *   <li>a claim that failed is thrown (nothing is decided), and a claim whose response was lost is the writer's.
 * </ul>
 */
class DynamoDBLogStoreTest {
  @TempDir java.nio.file.Path dir;

  private final Configuration conf = new Configuration();
  private final InMemoryDynamoDb dynamo = new InMemoryDynamoDb();
  private Path table;
  private Path log;
  private String tablePath;

  /** A log store whose steps after a claim fail on demand. */
  private final class Faulty extends DynamoDBLogStore {
    int failWriteCopy;
    int failWriteComplete;
    int failFixCopy;
    int failFixComplete;

    Faulty() throws IOException {
      super(conf, dynamo);
    }

    @Override
    void writeCopyTempFile(FileSystem fs, Path temp, Path target) throws IOException {
      if (failWriteCopy-- > 0) {
        throw new IOException("injected: the copy to " + target.getName() + " failed");
      }
      super.writeCopyTempFile(fs, temp, target);
    }

    @Override
    void writePutCompleteEntry(Path log, String fileName, String tempName) throws IOException {
      if (failWriteComplete-- > 0) {
        throw DynamoDbException.builder().message("injected: the completion of " + fileName + " failed").build();
      }
      super.writePutCompleteEntry(log, fileName, tempName);
    }

    @Override
    void fixCopyTempFile(FileSystem fs, Path temp, Path target) throws IOException {
      if (failFixCopy-- > 0) {
        throw new IOException("injected: the recovery's copy to " + target.getName() + " failed");
      }
      super.fixCopyTempFile(fs, temp, target);
    }

    @Override
    void fixPutCompleteEntry(Path log, String fileName, String tempName) throws IOException {
      if (failFixComplete-- > 0) {
        throw DynamoDbException.builder().message("injected: the recovery's completion of " + fileName + " failed").build();
      }
      super.fixPutCompleteEntry(log, fileName, tempName);
    }
  }

  @BeforeEach
  void setUp() throws IOException {
    FileSystem fs = FileSystem.getLocal(conf);
    table = fs.makeQualified(new Path(dir.resolve("table").toUri()));
    log = new Path(table, "_delta_log");
    tablePath = table.toString();
    fs.mkdirs(log);
  }

  private static String name(long version) {
    return String.format("%020d.json", version);
  }

  private void commit(DynamoDBLogStore store, long version, String... actions) throws IOException {
    store.write(new Path(log, name(version)), List.of(actions).iterator(), false, conf);
  }

  private List<String> read(DynamoDBLogStore store, long version) throws IOException {
    List<String> lines = new ArrayList<>();
    try (CloseableIterator<String> it = store.read(new Path(log, name(version)), conf)) {
      it.forEachRemaining(lines::add);
    }
    return lines;
  }

  /** The commit files a reader lists (Delta lists the log from version 0 before it reads a snapshot). */
  private List<String> listed(DynamoDBLogStore store) throws IOException {
    List<String> names = new ArrayList<>();
    Iterator<FileStatus> it = store.listFrom(new Path(log, name(0)), conf);
    while (it.hasNext()) {
      String fileName = it.next().getPath().getName();
      if (fileName.endsWith(".json")) {
        names.add(fileName);
      }
    }
    return names;
  }

  private boolean exists(long version) throws IOException {
    return FileSystem.getLocal(conf).exists(new Path(log, name(version)));
  }

  private Map<String, AttributeValue> item(long version) {
    Map<String, AttributeValue> item = dynamo.item(tablePath, name(version));
    assertNotNull(item, "no DynamoDB item for " + name(version));
    return item;
  }

  private boolean complete(long version) {
    Map<String, AttributeValue> item = item(version);
    boolean done = "true".equals(item.get("complete").s());
    assertEquals(done, item.containsKey("expireTime"), "expireTime goes with complete=true: " + item);
    return done;
  }

  /** The state a writer leaves when it dies right after its claim: its temporary file and an incomplete item. */
  private String claimAndDie(long version, String... actions) throws IOException {
    String tempName = ".tmp/" + name(version) + ".dead-writer";
    try (var out = FileSystem.getLocal(conf).create(new Path(log, tempName), true)) {
      for (String action : actions) {
        out.write((action + "\n").getBytes(java.nio.charset.StandardCharsets.UTF_8));
      }
    }
    dynamo.put(
        Map.of(
            "tablePath", AttributeValue.fromS(tablePath),
            "fileName", AttributeValue.fromS(name(version)),
            "tempPath", AttributeValue.fromS(tempName),
            "complete", AttributeValue.fromS("false")));
    return tempName;
  }

  @Test
  void commitsEachVersionOnceAndCompletesItsItem() throws IOException {
    DynamoDBLogStore store = new DynamoDBLogStore(conf, dynamo);
    commit(store, 0, "{\"v\":0}");
    commit(store, 1, "{\"v\":1}");
    assertEquals(List.of(name(0), name(1)), listed(store));
    assertEquals(List.of("{\"v\":1}"), read(store, 1));
    assertTrue(complete(0) && complete(1));
    // Another driver that read version 0 and commits version 1 again loses, and leaves no temporary file.
    DynamoDBLogStore other = new DynamoDBLogStore(conf, dynamo);
    assertThrows(FileAlreadyExistsException.class, () -> commit(other, 1, "{\"other\":1}"));
    assertEquals(List.of("{\"v\":1}"), read(store, 1));
    assertEquals(2, FileSystem.getLocal(conf).listStatus(new Path(log, ".tmp")).length);
  }

  @Test
  void aCopyThatFailsAfterTheClaimIsNotThrownAndTheNextReaderCompletesTheCommit() throws IOException {
    Faulty writer = new Faulty();
    commit(writer, 0, "{\"v\":0}");
    writer.failWriteCopy = 1;
    commit(writer, 1, "{\"v\":1}"); // decided by the claim: returns normally, as Delta's log store does
    assertFalse(exists(1));
    assertFalse(complete(1));
    DynamoDBLogStore reader = new DynamoDBLogStore(conf, dynamo); // another driver
    assertEquals(List.of(name(0), name(1)), listed(reader));
    assertEquals(List.of("{\"v\":1}"), read(reader, 1));
    assertTrue(complete(1));
    commit(writer, 2, "{\"v\":2}");
    assertEquals(List.of(name(0), name(1), name(2)), listed(writer));
  }

  @Test
  void aCompletionThatFailsAfterTheCopyIsNotThrownAndTheNextWriterCompletesTheItem() throws IOException {
    Faulty writer = new Faulty();
    commit(writer, 0, "{\"v\":0}");
    writer.failWriteComplete = 1;
    commit(writer, 1, "{\"v\":1}");
    assertTrue(exists(1));
    assertFalse(complete(1));
    DynamoDBLogStore next = new DynamoDBLogStore(conf, dynamo);
    commit(next, 2, "{\"v\":2}");
    assertTrue(complete(1) && complete(2));
    assertEquals(List.of(name(0), name(1), name(2)), listed(next));
    assertEquals(List.of("{\"v\":1}"), read(next, 1));
  }

  @Test
  void aClaimThatFailsIsThrownAndDecidesNothing() throws IOException {
    DynamoDBLogStore writer = new DynamoDBLogStore(conf, dynamo);
    commit(writer, 0, "{\"v\":0}");
    dynamo.failPuts = 1;
    assertThrows(DynamoDbException.class, () -> commit(writer, 1, "{\"v\":1}"));
    assertFalse(exists(1));
    assertEquals(List.of(name(0)), dynamo.fileNames(tablePath));
    assertEquals(List.of(name(0)), listed(writer));
    commit(writer, 1, "{\"v\":1 retried}");
    assertEquals(List.of("{\"v\":1 retried}"), read(writer, 1));
  }

  @Test
  void aClaimWhoseResponseWasLostIsTheWritersCommit() throws IOException {
    // The put reached DynamoDB, its response did not; the SDK's retry then fails the condition on the writer's own
    // item. The version is the writer's: taking it for another's claim would throw for a commit that a reader
    // then completes (from a temporary file the writer had deleted: the log stuck at a version it cannot read).
    DynamoDBLogStore writer = new DynamoDBLogStore(conf, dynamo);
    commit(writer, 0, "{\"v\":0}");
    dynamo.loseClaimResponse = true;
    commit(writer, 1, "{\"v\":1}");
    assertTrue(complete(1));
    DynamoDBLogStore reader = new DynamoDBLogStore(conf, dynamo);
    assertEquals(List.of(name(0), name(1)), listed(reader));
    assertEquals(List.of("{\"v\":1}"), read(reader, 1));
  }

  @Test
  void aWriterThatDiedAfterItsClaimIsCompletedByAReader() throws IOException {
    DynamoDBLogStore first = new DynamoDBLogStore(conf, dynamo);
    commit(first, 0, "{\"v\":0}");
    commit(first, 1, "{\"v\":1}");
    claimAndDie(2, "{\"v\":2}", "{\"dead\":true}");
    assertFalse(exists(2));
    DynamoDBLogStore reader = new DynamoDBLogStore(conf, dynamo);
    assertEquals(List.of(name(0), name(1), name(2)), listed(reader));
    assertEquals(List.of("{\"v\":2}", "{\"dead\":true}"), read(reader, 2));
    assertTrue(complete(2));
    commit(reader, 3, "{\"v\":3}");
    assertEquals(List.of(name(0), name(1), name(2), name(3)), listed(reader));
  }

  @Test
  void aWriterThatDiedAfterItsClaimIsCompletedByTheNextWriterAndItsVersionIsNotWrittenTwice() throws IOException {
    DynamoDBLogStore first = new DynamoDBLogStore(conf, dynamo);
    commit(first, 0, "{\"v\":0}");
    claimAndDie(1, "{\"dead\":1}");
    // A writer that read version 0 commits version 1: the dead writer's claim holds it, so this one is told that
    // N exists (Delta then reads version 1 and retries at 2), and version 1 is the dead writer's, completed.
    DynamoDBLogStore next = new DynamoDBLogStore(conf, dynamo);
    assertThrows(FileAlreadyExistsException.class, () -> commit(next, 1, "{\"next\":1}"));
    assertEquals(List.of("{\"dead\":1}"), read(next, 1));
    assertTrue(complete(1));
    commit(next, 2, "{\"next\":1}");
    assertEquals(List.of(name(0), name(1), name(2)), listed(next));
    assertEquals(List.of("{\"next\":1}"), read(next, 2));
    assertEquals(List.of(name(0), name(1), name(2)), dynamo.fileNames(tablePath));
    assertTrue(complete(0) && complete(1) && complete(2));
  }

  @Test
  void aWriterThatDiedAfterItsCopyIsCompletedWithoutRewritingTheFile() throws IOException {
    DynamoDBLogStore first = new DynamoDBLogStore(conf, dynamo);
    commit(first, 0, "{\"v\":0}");
    String tempName = claimAndDie(1, "{\"v\":1}");
    FileSystem fs = FileSystem.getLocal(conf);
    fs.rename(new Path(log, tempName), new Path(log, name(1))); // copied, then died before the completion
    DynamoDBLogStore reader = new DynamoDBLogStore(conf, dynamo);
    assertEquals(List.of(name(0), name(1)), listed(reader));
    assertEquals(List.of("{\"v\":1}"), read(reader, 1));
    assertTrue(complete(1));
  }

  @Test
  void theRecoveryRetriesATransientFailure() throws IOException {
    DynamoDBLogStore first = new DynamoDBLogStore(conf, dynamo);
    commit(first, 0, "{\"v\":0}");
    claimAndDie(1, "{\"v\":1}");
    Faulty reader = new Faulty();
    reader.failFixCopy = 1;
    reader.failFixComplete = 2;
    assertEquals(List.of(name(0), name(1)), listed(reader));
    assertTrue(complete(1));
    assertEquals(List.of("{\"v\":1}"), read(reader, 1));
    // A store that cannot finish it says so: the reader cannot read past a claimed version it cannot complete.
    claimAndDie(2, "{\"v\":2}");
    Faulty broken = new Faulty();
    broken.failFixCopy = 100;
    assertThrows(IOException.class, () -> listed(broken));
    assertFalse(complete(2));
    assertEquals(List.of(name(0), name(1), name(2)), listed(new DynamoDBLogStore(conf, dynamo)));
  }
}
