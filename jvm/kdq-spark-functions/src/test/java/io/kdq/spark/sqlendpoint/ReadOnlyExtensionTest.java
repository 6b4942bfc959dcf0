package io.kdq.spark.sqlendpoint;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.NamedExpression$;
import org.apache.spark.sql.catalyst.expressions.PythonUDF;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.OneRowRelation;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The read-only rule on a local SparkSession with Delta, set up the way the SQL endpoint is: tables and
 * a view registered first, then {@link ReadOnlyExtension#enforce}; every client statement runs in a new
 * session (as each JDBC and Spark Connect client gets one).
 */
class ReadOnlyExtensionTest {
  private static Path dir;
  private static SparkSession spark;
  private static Path table;
  private static Path secret;

  @BeforeAll
  static void start() throws Exception {
    dir = Files.createTempDirectory("kdq-read-only");
    table = dir.resolve("tables").resolve("window_counts");
    secret = dir.resolve("secret.txt");
    Files.writeString(secret, "KDQ_SQL_PASSWORD=s3cret\n", StandardCharsets.UTF_8);
    spark = SparkSession.builder().master("local[1]")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension," + ReadOnlyExtension.class.getName())
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.sql.warehouse.dir", dir.resolve("warehouse").toUri().toString())
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.ui.enabled", "false")
        .getOrCreate();
    // Start-up, as the endpoint's session factory does it: nothing is refused yet.
    spark.sql("CREATE DATABASE kdq");
    spark.sql("CREATE TABLE kdq.window_counts (topic STRING, status STRING, count BIGINT) USING delta LOCATION '"
        + table.toUri() + "'");
    spark.sql("INSERT INTO kdq.window_counts VALUES ('a', 'valid', 5), ('a', 'invalid', 1), ('b', 'valid', 2)");
    spark.sql("INSERT INTO kdq.window_counts VALUES ('b', 'invalid', 3)");
    spark.sql("CREATE VIEW kdq.counts_by_topic AS SELECT topic, sum(count) AS n FROM kdq.window_counts GROUP BY topic");
    assertEquals("read-only: 1 table locations", ReadOnlyExtension.enforce(spark));
  }

  @AfterAll
  static void stop() throws Exception {
    if (spark != null) {
      spark.stop();
    }
    if (dir != null) {
      try (var paths = Files.walk(dir)) {
        paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  /** A client's session: a new session of the endpoint's. */
  private static SparkSession client() {
    return spark.newSession();
  }

  private static String refusal(String sql) {
    Exception e = assertThrows(Exception.class, () -> client().sql(sql).collect(), sql);
    assertTrue(String.valueOf(e.getMessage()).startsWith(ReadOnlyExtension.PREFIX), sql + " -> " + e);
    return e.getMessage();
  }

  private static long count(SparkSession session, String sql) {
    return ((Number) session.sql(sql).collectAsList().get(0).get(0)).longValue();
  }

  @ParameterizedTest
  @CsvSource(delimiter = '|', value = {
      "CREATE TABLE kdq.probe (a INT) USING delta                                  | CreateTable is not allowed",
      "CREATE TABLE kdq.probe USING delta AS SELECT 1 AS a                          | CreateTableAsSelect",
      "DROP TABLE kdq.window_counts                                                 | DropTable is not allowed (only queries of the kdq tables and views)",
      "DROP VIEW kdq.counts_by_topic                                                | DropTableCommand",
      "DELETE FROM kdq.window_counts                                                | DeleteCommand",
      "DELETE FROM kdq.window_counts WHERE topic = 'a'                              | DeleteCommand",
      "UPDATE kdq.window_counts SET count = 0                                       | UpdateCommand",
      "INSERT INTO kdq.window_counts VALUES ('c', 'valid', 1)                       | AppendData",
      "INSERT OVERWRITE kdq.window_counts SELECT * FROM kdq.window_counts           | OverwriteByExpression",
      "MERGE INTO kdq.window_counts t USING (SELECT 'a' AS topic) s ON t.topic = s.topic WHEN MATCHED THEN DELETE | MergeIntoCommand",
      "ALTER TABLE kdq.window_counts ADD COLUMNS (x INT)                            | AddColumns",
      "ALTER TABLE kdq.window_counts SET TBLPROPERTIES ('x' = 'y')                  | SetTableProperties",
      "ALTER TABLE kdq.window_counts RENAME TO kdq.gone                             | RenameTable",
      "ALTER VIEW kdq.counts_by_topic AS SELECT 1 AS n                              | AlterViewAsCommand",
      "TRUNCATE TABLE kdq.window_counts                                             | TruncateDeltaTableCommand",
      "COMMENT ON TABLE kdq.window_counts IS 'x'                                    | CommentOnTable",
      "CACHE TABLE kdq.window_counts                                                | CacheTable",
      "UNCACHE TABLE kdq.window_counts                                              | UncacheTable",
      "CLEAR CACHE                                                                  | ClearCacheCommand",
      "REFRESH TABLE kdq.window_counts                                              | RefreshTable",
      "ADD JAR /tmp/kdq-probe.jar                                                   | AddJarsCommand",
      "ADD FILE /etc/hostname                                                       | AddFilesCommand",
      "LIST JARS                                                                    | ListJarsCommand",
      "CREATE FUNCTION kdq.f AS 'x.Y'                                               | CreateFunctionCommand",
      "CREATE TEMPORARY FUNCTION f AS 'x.Y'                                         | CreateFunctionCommand",
      "CREATE DATABASE evil                                                         | CreateNamespace",
      "DROP DATABASE kdq CASCADE                                                    | DropNamespace",
      "CREATE VIEW kdq.v2 AS SELECT 1 AS a                                          | CreateViewCommand of PersistedView",
      "CREATE GLOBAL TEMPORARY VIEW g AS SELECT 1 AS a                              | CreateViewCommand of GlobalTempView",
      "CREATE TEMPORARY VIEW tu USING text OPTIONS (path '/etc/hostname')           | CreateTempViewUsing",
      "VACUUM kdq.window_counts                                                     | VacuumTableCommand",
      "OPTIMIZE kdq.window_counts                                                   | OptimizeTableCommand",
      "RESTORE TABLE kdq.window_counts TO VERSION AS OF 0                           | RestoreTableCommand",
      "REORG TABLE kdq.window_counts APPLY (PURGE)                                  | DeltaReorgTableCommand",
      "CREATE TABLE kdq.c SHALLOW CLONE kdq.window_counts                           | CreateDeltaTableCommand",
      "ANALYZE TABLE kdq.window_counts COMPUTE STATISTICS                           | AnalyzeTable",
      "MSCK REPAIR TABLE kdq.window_counts                                          | RepairTable",
      "LOAD DATA LOCAL INPATH '/etc/hostname' INTO TABLE kdq.window_counts          | LoadData",
      "INSERT OVERWRITE DIRECTORY '/tmp/kdq-probe-out' USING parquet SELECT 1       | InsertIntoDataSourceDirCommand",
      "DECLARE VARIABLE v INT DEFAULT 1                                             | CreateVariable",
      "EXECUTE IMMEDIATE 'DROP TABLE kdq.window_counts'                             | DropTable",
      "SET spark.kdq.sql.readOnly=false                                             | SET spark.kdq.sql.readOnly is not allowed",
      "SET spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension            | SET spark.sql.extensions",
      "SET spark.sql.warehouse.dir=/tmp                                             | SET spark.sql.warehouse.dir",
      "SET spark.hadoop.fs.defaultFS=file:///                                       | SET spark.hadoop.fs.defaultFS",
      "SET spark.sql.catalog.evil=org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog | SET spark.sql.catalog.evil",
      "SET spark.sql.catalog.spark_catalog=x.Y                                      | SET spark.sql.catalog.spark_catalog",
      "SET spark.sql.redaction.options.regex=nothing                                | SET spark.sql.redaction.options.regex",
      "SET spark.driver.memory=8g                                                   | SET spark.driver.memory",
      "SET hivevar:x=1                                                              | SET hivevar:x",
      "RESET                                                                        | RESET is not allowed",
      "SELECT java_method('java.lang.System', 'getenv', 'HOME')                    | java_method/reflect/try_reflect (CallMethodViaReflection)",
      "SELECT reflect('java.lang.System', 'getenv', 'HOME')                        | CallMethodViaReflection",
      "SELECT try_reflect('java.lang.System', 'getenv', 'HOME')                    | TryReflect",
      "SELECT topic FROM kdq.window_counts WHERE topic IN (SELECT reflect('java.lang.System', 'getenv', 'HOME')) | CallMethodViaReflection",
      "WITH x AS (SELECT java_method('java.lang.System', 'getenv', 'HOME') AS v) SELECT * FROM x | CallMethodViaReflection",
      "CREATE TEMPORARY VIEW tj AS SELECT java_method('java.lang.System', 'getenv', 'HOME') AS v | CallMethodViaReflection",
      "SELECT TRANSFORM(topic) USING 'cat /etc/hostname' AS (x) FROM kdq.window_counts | TRANSFORM ... USING (ScriptTransformation)",
      "SELECT * FROM text.`/etc/hostname`                                           | reading file:/etc/hostname (outside the kdq tables' locations)",
      "SELECT * FROM json.`/proc/self/environ`                                      | outside the kdq tables' locations",
  })
  void refusesWhatWritesChangesStateOrRunsCode(String sql, String expected) {
    String message = refusal(sql.strip());
    assertTrue(message.contains(expected.strip()), message);
  }

  @Test
  void refusesFilesOutsideTheTablesLocations() {
    assertTrue(refusal("SELECT * FROM text.`" + secret.toUri() + "`").contains("outside the kdq tables' locations"));
    String location = table.toUri().toString().replaceAll("/+$", "");
    // A sibling folder whose name starts like the table's is not under it.
    assertFalse(ReadOnlyCheck.underTableLocation(URI.create(location + "_copy")));
    assertTrue(ReadOnlyCheck.underTableLocation(URI.create(location + "/_delta_log/00000000000000000000.json")));
    assertTrue(ReadOnlyCheck.underTableLocation(URI.create(location)));
    assertFalse(ReadOnlyCheck.underTableLocation(URI.create(location + "/../secret.txt")));
    assertFalse(ReadOnlyCheck.underTableLocation(table.getParent().toUri()));
    assertFalse(ReadOnlyCheck.underTableLocation(URI.create("s3a://bucket" + table.toUri().getPath())));
  }

  @Test
  void refusesUdfsAndTypedFunctionsOfTheClient() {
    SparkSession client = client();
    UserDefinedFunction identity = functions.udf((UDF1<Long, Long>) x -> x, DataTypes.LongType);
    Exception udf = assertThrows(Exception.class,
        () -> client.range(1).select(identity.apply(functions.col("id"))).collect());
    assertTrue(udf.getMessage().startsWith(ReadOnlyExtension.PREFIX) && udf.getMessage().contains("(ScalaUDF)"),
        udf.getMessage());
    Exception map = assertThrows(Exception.class,
        () -> client.range(3).map((MapFunction<Long, Long>) x -> x + 1, Encoders.LONG()).collect());
    assertTrue(map.getMessage().contains("MapElements with a client's function"), map.getMessage());
    // A Python UDF as Spark Connect or PySpark would put it into a plan (its function is never called here).
    Expression python = new PythonUDF("steal", null, DataTypes.BooleanType,
        CollectionConverters.asScala(List.<Expression>of()).toSeq(), 100, true, NamedExpression$.MODULE$.newExprId());
    String why = ReadOnlyCheck.refusal(new Filter(python, new OneRowRelation()));
    assertEquals(ReadOnlyExtension.PREFIX + "the Python function steal (PythonUDF) is not allowed "
        + "(only queries of the kdq tables and views)", why);
  }

  @ParameterizedTest
  @ValueSource(strings = {
      "SELECT topic, status, count FROM kdq.window_counts ORDER BY topic, status",
      "SELECT * FROM kdq.counts_by_topic",
      "SELECT count(*) FROM kdq.window_counts VERSION AS OF 1",
      "SELECT (SELECT max(count) FROM kdq.window_counts) AS m",
      "WITH t AS (SELECT topic FROM kdq.window_counts) SELECT count(*) FROM t",
      "SELECT upper(topic), sha2(status, 256), current_user() FROM kdq.window_counts",
      "SELECT * FROM range(3)",
      "VALUES (1, 'x')",
      "SHOW TABLES IN kdq",
      "SHOW DATABASES",
      "SHOW VIEWS IN kdq",
      "SHOW COLUMNS IN kdq.window_counts",
      "SHOW TBLPROPERTIES kdq.window_counts",
      "SHOW FUNCTIONS LIKE 'upper'",
      "SHOW CATALOGS",
      "SHOW CURRENT NAMESPACE",
      "DESCRIBE kdq.window_counts",
      "DESCRIBE TABLE EXTENDED kdq.window_counts",
      "DESCRIBE kdq.counts_by_topic",
      "DESCRIBE kdq.window_counts topic",
      "DESCRIBE DATABASE kdq",
      "DESCRIBE FUNCTION upper",
      "DESCRIBE QUERY SELECT * FROM kdq.window_counts",
      "DESCRIBE HISTORY kdq.window_counts",
      "DESCRIBE DETAIL kdq.window_counts",
      "EXPLAIN SELECT * FROM kdq.window_counts",
      "EXPLAIN EXTENDED SELECT * FROM kdq.counts_by_topic",
      "SET",
      "SET -v",
      "SET spark.sql.session.timeZone",
      "SET spark.sql.session.timeZone=UTC",
      "SET TIME ZONE 'Europe/Paris'",
      "SET spark.sql.ansi.enabled=true",
      "RESET spark.sql.session.timeZone",
      "USE kdq",
      "USE spark_catalog.kdq",
      "SET CATALOG spark_catalog",
      "CREATE OR REPLACE TEMPORARY VIEW mine AS SELECT topic FROM kdq.window_counts",
  })
  void allowsReadsDescriptionsAndSessionSettings(String sql) {
    assertDoesNotThrow(() -> client().sql(sql).collect(), sql);
  }

  @Test
  void readsSeeTheTablesAndClientsKeepTheirOwnSessionState() {
    SparkSession client = client();
    assertEquals(11, count(client, "SELECT sum(count) FROM kdq.window_counts"));
    assertEquals(2, count(client, "SELECT count(*) FROM kdq.counts_by_topic"));
    // The table's files by path: the same data, under its location.
    assertEquals(4, count(client, "SELECT count(*) FROM delta.`" + table.toUri() + "`"));
    client.sql("SET spark.sql.session.timeZone=America/New_York");
    client.sql("CREATE TEMPORARY VIEW a_only AS SELECT * FROM kdq.window_counts WHERE topic = 'a'");
    assertEquals(6, count(client, "SELECT sum(count) FROM a_only"));
    assertEquals("America/New_York", client.conf().get("spark.sql.session.timeZone"));
    assertFalse(spark.conf().get("spark.sql.session.timeZone").equals("America/New_York"));
    // The endpoint's own session is read-only too once enforced.
    Exception own = assertThrows(Exception.class, () -> spark.sql("DROP TABLE kdq.window_counts"));
    assertTrue(own.getMessage().startsWith(ReadOnlyExtension.PREFIX), own.getMessage());
    assertEquals(4, count(client(), "SELECT count(*) FROM kdq.window_counts"));
  }

  @Test
  void deltasOwnLogReplayPasses() throws Exception {
    // A new snapshot of the table is built in the client's session (Delta's typed operations and UDFs over
    // the log files): none of it is refused.
    Class.forName("org.apache.spark.sql.delta.DeltaLog").getMethod("clearCache").invoke(null);
    SparkSession client = client();
    assertEquals(11, count(client, "SELECT sum(count) FROM kdq.window_counts WHERE status IS NOT NULL"));
    Row history = client.sql("DESCRIBE HISTORY kdq.window_counts").collectAsList().get(0);
    assertNotNull(history);
    assertEquals(2L, ((Number) history.getAs("version")).longValue());
  }

  @Test
  void refusesASessionWhoseSettingsChangedOutsideSet() {
    // What the Thrift server does with the settings of a JDBC URL (;?key=value, #var=value) when it opens a
    // session: no SET, no plan; the session's Hadoop conf gets every one of them too.
    for (String key : List.of("spark.sql.catalog.probe", "fs.file.impl", "spark.kdq.sql.readOnly", "a_hive_variable")) {
      SparkSession client = client();
      client.sessionState().conf().setConfString(key, "org.example.Probe");
      Exception e = assertThrows(Exception.class, () -> client.sql("SELECT count(*) FROM kdq.window_counts").collect());
      assertTrue(e.getMessage().startsWith(ReadOnlyExtension.PREFIX + "the setting " + key + " of this session "
          + "(given outside SET, e.g. in a JDBC URL) is not allowed"), e.getMessage());
    }
    // A session setting, and the fetch size Hive's JDBC driver sends with every session: answered.
    SparkSession client = client();
    client.sessionState().conf().setConfString("spark.sql.session.timeZone", "UTC");
    client.sessionState().conf().setConfString("hive.server2.thrift.resultset.default.fetch.size", "1000");
    assertEquals(4, count(client, "SELECT count(*) FROM kdq.window_counts"));
    // The server's own settings outside its SQL conf (Hadoop conf, system properties), copied into a session as
    // the Thrift server does with its HiveConf: answered.
    spark.sparkContext().hadoopConfiguration().set("hive.server2.use.SSL", "true");
    SparkSession copied = client();
    copied.sessionState().conf().setConfString("hive.server2.use.SSL", "true");
    assertEquals(4, count(copied, "SELECT count(*) FROM kdq.window_counts"));
    copied.sessionState().conf().setConfString("hive.server2.use.SSL", "false"); // not the server's value
    assertThrows(Exception.class, () -> copied.sql("SELECT 1").collect());
    // The endpoint's own settings, changed in a client's session, are refused too.
    SparkSession changed = client();
    changed.sessionState().conf().setConfString("spark.sql.warehouse.dir", dir.resolve("elsewhere").toUri().toString());
    assertThrows(Exception.class, () -> changed.sql("SELECT 1").collect());
  }

  @Test
  void enforcingAgainKeepsRefusing() {
    assertTrue(ReadOnlyExtension.enforce(spark).startsWith("read-only: "));
    assertTrue(ReadOnlyExtension.enforced());
    refusal("DROP TABLE kdq.window_counts");
  }

  @Test
  void sessionSettingsAreRegisteredNonStaticSqlSettings() {
    assertTrue(ReadOnlyExtension.sessionSetting("spark.sql.session.timeZone"));
    assertTrue(ReadOnlyExtension.sessionSetting("spark.sql.ansi.enabled"));
    assertTrue(ReadOnlyExtension.sessionSetting("spark.sql.shuffle.partitions"));
    assertFalse(ReadOnlyExtension.sessionSetting("spark.sql.extensions")); // static
    assertFalse(ReadOnlyExtension.sessionSetting("spark.sql.warehouse.dir")); // static
    assertFalse(ReadOnlyExtension.sessionSetting("spark.sql.catalog.spark_catalog"));
    assertFalse(ReadOnlyExtension.sessionSetting("spark.sql.catalog.evil"));
    assertFalse(ReadOnlyExtension.sessionSetting("spark.sql.variable.substitute")); // ${key} reads any setting
    assertFalse(ReadOnlyExtension.sessionSetting("spark.sql.no.such.setting"));
    assertFalse(ReadOnlyExtension.sessionSetting("spark.kdq.sql.readOnly"));
    assertFalse(ReadOnlyExtension.sessionSetting("spark.hadoop.fs.s3a.endpoint"));
    assertFalse(ReadOnlyExtension.sessionSetting("spark.executor.memory"));
    assertFalse(ReadOnlyExtension.sessionSetting(null));
    assertNull(ReadOnlyCheck.refusal(new OneRowRelation()));
  }
}
