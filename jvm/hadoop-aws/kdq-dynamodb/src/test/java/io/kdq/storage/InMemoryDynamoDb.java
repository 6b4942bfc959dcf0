package io.kdq.storage;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.TreeMap;
import software.amazon.awssdk.services.dynamodb.DynamoDbClient;
import software.amazon.awssdk.services.dynamodb.model.AttributeValue;
import software.amazon.awssdk.services.dynamodb.model.ConditionalCheckFailedException;
import software.amazon.awssdk.services.dynamodb.model.CreateTableRequest;
import software.amazon.awssdk.services.dynamodb.model.CreateTableResponse;
import software.amazon.awssdk.services.dynamodb.model.DescribeTableRequest;
import software.amazon.awssdk.services.dynamodb.model.DescribeTableResponse;
import software.amazon.awssdk.services.dynamodb.model.DynamoDbException;
import software.amazon.awssdk.services.dynamodb.model.GetItemRequest;
import software.amazon.awssdk.services.dynamodb.model.GetItemResponse;
import software.amazon.awssdk.services.dynamodb.model.PutItemRequest;
import software.amazon.awssdk.services.dynamodb.model.PutItemResponse;
import software.amazon.awssdk.services.dynamodb.model.QueryRequest;
import software.amazon.awssdk.services.dynamodb.model.QueryResponse;
import software.amazon.awssdk.services.dynamodb.model.ResourceNotFoundException;
import software.amazon.awssdk.services.dynamodb.model.TableDescription;
import software.amazon.awssdk.services.dynamodb.model.TableStatus;

/**
 * DynamoDB in memory, as much of it as the log store uses: one table keyed (tablePath, fileName), puts with or
 * without {@code attribute_not_exists(fileName)}, consistent gets, and the query of a table path's items by file
 * name, newest first. Faults: {@link #failPuts} (the next puts throw, nothing stored) and {@link #loseClaimResponse}
 * (the next conditional put is applied, but its caller gets {@code ConditionalCheckFailedException}, as when the
 * SDK retries a put whose first response was lost).
 */
final class InMemoryDynamoDb implements DynamoDbClient {
  private final Map<String, NavigableMap<String, Map<String, AttributeValue>>> items = new HashMap<>();
  private String table;
  int failPuts;
  boolean loseClaimResponse;
  final List<String> puts = new ArrayList<>();

  @Override
  public String serviceName() {
    return "dynamodb";
  }

  @Override
  public void close() {}

  @Override
  public synchronized DescribeTableResponse describeTable(DescribeTableRequest request) {
    if (!request.tableName().equals(table)) {
      throw ResourceNotFoundException.builder().message("no table " + request.tableName()).build();
    }
    return DescribeTableResponse.builder()
        .table(TableDescription.builder().tableName(table).tableStatus(TableStatus.ACTIVE).build())
        .build();
  }

  @Override
  public synchronized CreateTableResponse createTable(CreateTableRequest request) {
    table = request.tableName();
    return CreateTableResponse.builder().build();
  }

  @Override
  public synchronized PutItemResponse putItem(PutItemRequest request) {
    checkTable(request.tableName());
    Map<String, AttributeValue> item = new HashMap<>(request.item());
    String fileName = item.get("fileName").s();
    puts.add(fileName + " complete=" + item.get("complete").s());
    if (failPuts > 0) {
      failPuts--;
      throw DynamoDbException.builder().message("injected: DynamoDB unavailable").statusCode(503).build();
    }
    NavigableMap<String, Map<String, AttributeValue>> entries =
        items.computeIfAbsent(item.get("tablePath").s(), ignored -> new TreeMap<>());
    String condition = request.conditionExpression();
    if (condition != null) {
      if (!condition.equals("attribute_not_exists(fileName)")) {
        throw new UnsupportedOperationException(condition);
      }
      if (entries.containsKey(fileName)) {
        throw ConditionalCheckFailedException.builder().message("taken: " + fileName).build();
      }
      if (loseClaimResponse) {
        loseClaimResponse = false;
        entries.put(fileName, item);
        throw ConditionalCheckFailedException.builder().message("retried after a lost response: " + fileName).build();
      }
    }
    entries.put(fileName, item);
    return PutItemResponse.builder().build();
  }

  @Override
  public synchronized GetItemResponse getItem(GetItemRequest request) {
    checkTable(request.tableName());
    Map<String, AttributeValue> item =
        items.getOrDefault(request.key().get("tablePath").s(), new TreeMap<>()).get(request.key().get("fileName").s());
    return GetItemResponse.builder().item(item).build();
  }

  @Override
  public synchronized QueryResponse query(QueryRequest request) {
    checkTable(request.tableName());
    if (!"tablePath = :t".equals(request.keyConditionExpression())) {
      throw new UnsupportedOperationException(request.keyConditionExpression());
    }
    NavigableMap<String, Map<String, AttributeValue>> entries =
        items.getOrDefault(request.expressionAttributeValues().get(":t").s(), new TreeMap<>());
    List<Map<String, AttributeValue>> found =
        new ArrayList<>(Boolean.FALSE.equals(request.scanIndexForward()) ? entries.descendingMap().values() : entries.values());
    if (request.limit() != null && found.size() > request.limit()) {
      found = found.subList(0, request.limit());
    }
    return QueryResponse.builder().items(found).build();
  }

  /** The item of one commit file, or null. */
  synchronized Map<String, AttributeValue> item(String tablePath, String fileName) {
    return items.getOrDefault(tablePath, new TreeMap<>()).get(fileName);
  }

  /** Every commit file with an item for the table path. */
  synchronized List<String> fileNames(String tablePath) {
    return new ArrayList<>(items.getOrDefault(tablePath, new TreeMap<>()).keySet());
  }

  /** Stores an item as it is, with no condition (the state another process left). */
  synchronized void put(Map<String, AttributeValue> item) {
    items.computeIfAbsent(item.get("tablePath").s(), ignored -> new TreeMap<>()).put(item.get("fileName").s(), item);
  }

  private void checkTable(String name) {
    if (!name.equals(table)) {
      throw ResourceNotFoundException.builder().message("no table " + name).build();
    }
  }
}
