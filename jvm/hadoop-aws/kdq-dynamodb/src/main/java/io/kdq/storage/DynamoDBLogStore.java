package io.kdq.storage;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.AwsCredentials;
import software.amazon.awssdk.auth.credentials.AwsCredentialsProvider;
import software.amazon.awssdk.auth.credentials.AwsSessionCredentials;
import software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.http.apache.ApacheHttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.dynamodb.DynamoDbClient;
import software.amazon.awssdk.services.dynamodb.DynamoDbClientBuilder;
import software.amazon.awssdk.services.dynamodb.model.AttributeDefinition;
import software.amazon.awssdk.services.dynamodb.model.AttributeValue;
import software.amazon.awssdk.services.dynamodb.model.BillingMode;
import software.amazon.awssdk.services.dynamodb.model.ConditionalCheckFailedException;
import software.amazon.awssdk.services.dynamodb.model.GetItemRequest;
import software.amazon.awssdk.services.dynamodb.model.KeySchemaElement;
import software.amazon.awssdk.services.dynamodb.model.KeyType;
import software.amazon.awssdk.services.dynamodb.model.PutItemRequest;
import software.amazon.awssdk.services.dynamodb.model.QueryRequest;
import software.amazon.awssdk.services.dynamodb.model.ResourceInUseException;
import software.amazon.awssdk.services.dynamodb.model.ResourceNotFoundException;
import software.amazon.awssdk.services.dynamodb.model.ScalarAttributeType;
import software.amazon.awssdk.services.dynamodb.model.TableStatus;

/**
 * A Delta log store for tables on S3 whose commits are coordinated through a DynamoDB table, so that several Spark
 * drivers can commit to one table: exactly one of them writes each version.
 *
 * <p>Delta commits version N by creating {@code _delta_log/N.json} only if it does not exist yet. S3 has no such
 * put-if-absent for a whole object name, and Delta's default S3 log store can only check inside one JVM: two
 * drivers committing the same version would both succeed, the later file replacing the earlier. Here a commit goes:
 *
 * <ol>
 *   <li>finish the table's latest commit if its writer stopped half-way (below), so N-1 is in the log;
 *   <li>write the actions to a temporary file {@code _delta_log/.tmp/N.json.<uuid>};
 *   <li>claim N: put the item (tablePath, N.json, tempPath, complete=false) in DynamoDB on condition that no item
 *       with that key exists. Exactly one writer succeeds; the others get a {@link FileAlreadyExistsException}, on
 *       which Delta reads the new version and retries at the next one;
 *   <li>copy the temporary file to {@code N.json};
 *   <li>mark the item complete, with an expiry time ({@code expireTime}, epoch seconds) for DynamoDB's TTL.
 * </ol>
 *
 * <p>A writer that dies between 3 and 5 leaves an incomplete latest item: the next commit or listing of the table
 * (every reader lists the log) copies its temporary file to {@code N.json} and completes it, so the claimed version
 * is never a hole. Once the claim is in DynamoDB the version is decided: a failure of the copy or of the completion
 * is logged, not thrown, as in Delta's S3DynamoDBLogStore (the caller would report a failed commit that the next
 * reader completes). The items have the layout of Delta's own DynamoDB log store (tablePath HASH, fileName RANGE,
 * tempPath relative to {@code _delta_log}, complete "true"/"false", expireTime).
 *
 * <p>Settings (Spark's configuration, which Delta hands to a log store with its Hadoop configuration):
 * {@code spark.kdq.dynamodb.table} (default {@code kdq_delta_log}), {@code spark.kdq.dynamodb.region} (default
 * {@code us-east-1}), {@code spark.kdq.dynamodb.endpoint} (a DynamoDB-compatible endpoint; else the AWS SDK's:
 * AWS_ENDPOINT_URL_DYNAMODB, or AWS's endpoint of the region), {@code spark.kdq.dynamodb.ttlSeconds} (default one
 * day). Credentials: S3A's keys ({@code fs.s3a.access.key}, {@code secret.key}, {@code session.token}), else the SDK's
 * default chain (environment, profile, the container's or instance's role). The table is made (on-demand) if it
 * does not exist.
 */
public class DynamoDBLogStore extends HadoopFileSystemLogStore {
  public static final String PREFIX = "spark.kdq.dynamodb.";
  private static final Pattern DELTA_FILE = Pattern.compile("\\d+\\.json");
  private static final Map<String, DynamoDbClient> CLIENTS = new ConcurrentHashMap<>();
  private static final Logger LOG = LoggerFactory.getLogger(DynamoDBLogStore.class);
  /** Attempts of the recovery of an incomplete commit before a listing or a commit gives up (Delta's: 4). */
  static final int FIX_ATTEMPTS = 4;

  private final DynamoDbClient client;
  private final String table;
  private final long ttlSeconds;

  public DynamoDBLogStore(Configuration conf) throws IOException {
    this(conf, client(conf));
  }

  /** A log store on the given client (the tests' in-memory DynamoDB). */
  DynamoDBLogStore(Configuration conf, DynamoDbClient client) throws IOException {
    super(conf);
    table = setting(conf, "table", "kdq_delta_log");
    ttlSeconds = Long.parseLong(setting(conf, "ttlSeconds", "86400"));
    this.client = client;
    ensureTable();
  }

  private static DynamoDbClient client(Configuration conf) throws IOException {
    String table = setting(conf, "table", "kdq_delta_log");
    String region = setting(conf, "region", "us-east-1");
    String endpoint = setting(conf, "endpoint", "");
    String key = secret(conf, "fs.s3a.access.key");
    String secretKey = secret(conf, "fs.s3a.secret.key");
    String token = secret(conf, "fs.s3a.session.token");
    String id = String.join("\n", table, region, endpoint, key == null ? "" : key, token == null ? "" : token);
    return CLIENTS.computeIfAbsent(id, ignored -> build(region, endpoint, key, secretKey, token));
  }

  private static String setting(Configuration conf, String name, String fallback) {
    String value = conf.get(PREFIX + name);
    return value == null || value.isBlank() ? fallback : value.trim();
  }

  private static String secret(Configuration conf, String name) throws IOException {
    char[] value = conf.getPassword(name); // the configuration, or a credential provider it names
    String text = value == null ? "" : new String(value).trim();
    return text.isEmpty() ? null : text;
  }

  private static DynamoDbClient build(String region, String endpoint, String key, String secretKey, String token) {
    AwsCredentialsProvider credentials;
    if (key != null && secretKey != null) {
      AwsCredentials keys =
          token != null ? AwsSessionCredentials.create(key, secretKey, token) : AwsBasicCredentials.create(key, secretKey);
      credentials = StaticCredentialsProvider.create(keys);
    } else {
      credentials = DefaultCredentialsProvider.builder().build();
    }
    DynamoDbClientBuilder builder =
        DynamoDbClient.builder()
            .region(Region.of(region))
            .credentialsProvider(credentials)
            .httpClientBuilder(ApacheHttpClient.builder());
    if (!endpoint.isEmpty()) {
      builder = builder.endpointOverride(URI.create(endpoint));
    }
    return builder.build();
  }

  /** The table exists and is active; made on-demand with Delta's key layout if it does not exist. */
  private void ensureTable() throws IOException {
    long deadline = System.nanoTime() + 120_000_000_000L;
    while (true) {
      TableStatus status;
      try {
        status = client.describeTable(b -> b.tableName(table)).table().tableStatus();
      } catch (ResourceNotFoundException missing) {
        try {
          client.createTable(
              b ->
                  b.tableName(table)
                      .billingMode(BillingMode.PAY_PER_REQUEST)
                      .attributeDefinitions(
                          AttributeDefinition.builder()
                              .attributeName("tablePath")
                              .attributeType(ScalarAttributeType.S)
                              .build(),
                          AttributeDefinition.builder()
                              .attributeName("fileName")
                              .attributeType(ScalarAttributeType.S)
                              .build())
                      .keySchema(
                          KeySchemaElement.builder().attributeName("tablePath").keyType(KeyType.HASH).build(),
                          KeySchemaElement.builder().attributeName("fileName").keyType(KeyType.RANGE).build()));
        } catch (ResourceInUseException concurrent) {
          // another process made it at the same moment
        }
        status = TableStatus.CREATING;
      }
      if (status == TableStatus.ACTIVE || status == TableStatus.UPDATING) {
        return;
      }
      if (System.nanoTime() > deadline) {
        throw new IOException("DynamoDB table " + table + " is not active: " + status);
      }
      try {
        Thread.sleep(1000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException("waiting for DynamoDB table " + table);
      }
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration conf) {
    return false; // an S3 object appears whole
  }

  @Override
  public Iterator<FileStatus> listFrom(Path path, Configuration conf) throws IOException {
    Path resolved = qualified(path, conf);
    if (isLogFolder(resolved.getParent())) {
      finishLatest(resolved.getFileSystem(conf), resolved.getParent());
    }
    return super.listFrom(path, conf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf) throws IOException {
    Path resolved = qualified(path, conf);
    FileSystem fs = resolved.getFileSystem(conf);
    if (overwrite || !DELTA_FILE.matcher(resolved.getName()).matches() || !isLogFolder(resolved.getParent())) {
      writeFile(fs, resolved, actions, overwrite); // checkpoints, _last_checkpoint: no claim needed
      return;
    }
    Path log = resolved.getParent();
    finishLatest(fs, log);
    if (fs.exists(resolved)) {
      throw new FileAlreadyExistsException(resolved.toString());
    }
    String tempName = ".tmp/" + resolved.getName() + "." + UUID.randomUUID();
    Path temp = new Path(log, tempName);
    writeFile(fs, temp, actions, true);
    try {
      client.putItem(item(log, resolved.getName(), tempName, false, null).conditionExpression(
          "attribute_not_exists(fileName)").build());
    } catch (ConditionalCheckFailedException taken) {
      // Another writer's claim, or this one's: the SDK retries a put whose response was lost, and the retry then
      // fails the condition on the item the first attempt stored.
      if (!tempName.equals(claimedTempPath(log, resolved.getName()))) {
        fs.delete(temp, false);
        throw new FileAlreadyExistsException(resolved.toString());
      }
    }
    // Version N is decided by the claim: a failure from here on must not reach the caller (Delta would report a
    // failed commit, and the caller might retry it, while the next reader or writer completes it from the
    // temporary file, as Delta's S3DynamoDBLogStore does).
    try {
      writeCopyTempFile(fs, temp, resolved);
      writePutCompleteEntry(log, resolved.getName(), tempName);
    } catch (IOException | RuntimeException e) {
      if (e instanceof InterruptedIOException) {
        Thread.currentThread().interrupt();
      }
      LOG.warn(
          "{} is committed (claimed in DynamoDB table {}) but not completed: {}. The next listing or commit of the"
              + " table copies {} to it and completes the item.",
          resolved,
          table,
          e.toString(),
          tempName,
          e);
    }
  }

  /** The temporary file named by the item of a commit file, or null without one. */
  private String claimedTempPath(Path log, String fileName) {
    Map<String, AttributeValue> item =
        client
            .getItem(
                GetItemRequest.builder()
                    .tableName(table)
                    .consistentRead(true)
                    .key(
                        Map.of(
                            "tablePath", AttributeValue.fromS(tablePath(log)),
                            "fileName", AttributeValue.fromS(fileName)))
                    .build())
            .item();
    return item == null || !item.containsKey("tempPath") ? null : item.get("tempPath").s();
  }

  /** Finish the table's latest commit if its writer stopped between its claim and its copy. */
  private void finishLatest(FileSystem fs, Path log) throws IOException {
    List<Map<String, AttributeValue>> items =
        client
            .query(
                QueryRequest.builder()
                    .tableName(table)
                    .consistentRead(true)
                    .scanIndexForward(false)
                    .limit(1)
                    .keyConditionExpression("tablePath = :t")
                    .expressionAttributeValues(Map.of(":t", AttributeValue.fromS(tablePath(log))))
                    .build())
            .items();
    Optional<Map<String, AttributeValue>> latest = items.stream().findFirst();
    if (latest.isEmpty() || "true".equals(latest.get().get("complete").s())) {
      return;
    }
    String fileName = latest.get().get("fileName").s();
    String tempName = latest.get().get("tempPath").s();
    Path target = new Path(log, fileName);
    boolean copied = false;
    for (int attempt = 1; ; attempt++) {
      try {
        if (!copied && !fs.exists(target)) {
          fixCopyTempFile(fs, new Path(log, tempName), target);
        }
        copied = true;
        fixPutCompleteEntry(log, fileName, tempName);
        LOG.info("completed {} from {}: its writer had stopped after claiming it", target, tempName);
        return;
      } catch (InterruptedIOException e) {
        throw e;
      } catch (IOException | RuntimeException e) {
        if (attempt >= FIX_ATTEMPTS) {
          throw new IOException("could not complete " + target + " from " + tempName + " (claimed in DynamoDB table "
              + table + ") after " + attempt + " attempts", e);
        }
        LOG.warn("completing {} from {} (attempt {} of {}): {}", target, tempName, attempt, FIX_ATTEMPTS, e.toString());
      }
    }
  }

  // The steps after a claim, one method each so that the tests can make them fail.

  /** A commit's copy of its temporary file to N.json, after its claim. */
  void writeCopyTempFile(FileSystem fs, Path temp, Path target) throws IOException {
    copy(fs, temp, target);
  }

  /** A commit's completion of its item, after its copy. */
  void writePutCompleteEntry(Path log, String fileName, String tempName) throws IOException {
    complete(log, fileName, tempName);
  }

  /** The recovery's copy of an incomplete commit's temporary file to N.json. */
  void fixCopyTempFile(FileSystem fs, Path temp, Path target) throws IOException {
    copy(fs, temp, target);
  }

  /** The recovery's completion of an incomplete commit's item. */
  void fixPutCompleteEntry(Path log, String fileName, String tempName) throws IOException {
    complete(log, fileName, tempName);
  }

  private void complete(Path log, String fileName, String tempName) {
    long expires = System.currentTimeMillis() / 1000 + ttlSeconds;
    client.putItem(item(log, fileName, tempName, true, expires).build());
  }

  private PutItemRequest.Builder item(Path log, String fileName, String tempName, boolean complete, Long expires) {
    Map<String, AttributeValue> item = new ConcurrentHashMap<>();
    item.put("tablePath", AttributeValue.fromS(tablePath(log)));
    item.put("fileName", AttributeValue.fromS(fileName));
    item.put("tempPath", AttributeValue.fromS(tempName));
    item.put("complete", AttributeValue.fromS(Boolean.toString(complete)));
    if (expires != null) {
      item.put("expireTime", AttributeValue.fromN(Long.toString(expires)));
    }
    return PutItemRequest.builder().tableName(table).item(item);
  }

  private static String tablePath(Path log) {
    return log.getParent().toString();
  }

  private static boolean isLogFolder(Path folder) {
    return folder != null && "_delta_log".equals(folder.getName());
  }

  private static Path qualified(Path path, Configuration conf) throws IOException {
    return path.getFileSystem(conf).makeQualified(path);
  }

  private static void writeFile(FileSystem fs, Path path, Iterator<String> actions, boolean overwrite)
      throws IOException {
    if (!overwrite && fs.exists(path)) {
      throw new FileAlreadyExistsException(path.toString());
    }
    try (FSDataOutputStream out = fs.create(path, overwrite)) {
      while (actions.hasNext()) {
        out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
      }
    }
  }

  private static void copy(FileSystem fs, Path from, Path to) throws IOException {
    try (InputStream in = fs.open(from);
        OutputStream out = fs.create(to, true)) {
      in.transferTo(out);
    }
  }
}
