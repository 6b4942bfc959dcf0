package io.kdq.spark.sqlendpoint;

import java.net.URI;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.AnalysisException;
import org.apache.spark.sql.catalyst.analysis.LocalTempView$;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.PlanExpression;
import org.apache.spark.sql.catalyst.expressions.PythonFuncExpression;
import org.apache.spark.sql.catalyst.expressions.ScalaUDF;
import org.apache.spark.sql.catalyst.expressions.TryReflect;
import org.apache.spark.sql.catalyst.expressions.UserDefinedExpression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.ParsedStatement;
import org.apache.spark.sql.catalyst.plans.logical.ScriptTransformation;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.aggregate.ScalaAggregator;
import org.apache.spark.sql.execution.aggregate.ScalaUDAF;
import org.apache.spark.sql.execution.command.CreateViewCommand;
import org.apache.spark.sql.execution.command.ResetCommand;
import org.apache.spark.sql.execution.command.SetCommand;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Function1;
import scala.Option;
import scala.Tuple2;
import scala.collection.immutable.Map$;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * The check rule of {@link ReadOnlyExtension}: once enforced, refuses every analyzed plan that is not a
 * read of the kdq tables and views (see {@link #refusal} for the rules). It judges Spark's plan classes,
 * never SQL text, so SQL over JDBC, SQL over Spark Connect and Spark Connect's DataFrame plans are
 * judged alike, and the plans Delta runs for a read (its log replay) are judged too and pass.
 */
final class ReadOnlyCheck implements Function1<LogicalPlan, BoxedUnit> {
  private static final Logger LOG = LoggerFactory.getLogger(ReadOnlyCheck.class);

  /** Commands that only read or touch the client's own session. Class simple names, after analysis. */
  static final Set<String> ALLOWED_COMMANDS = Set.of(
      // USE kdq, SET CATALOG
      "SetCatalogAndNamespace", "SetNamespaceCommand", "SetCatalogCommand",
      // SHOW ...
      "ShowTables", "ShowTablesCommand", "ShowTablesExtended", "ShowTableExtended", "ShowNamespaces",
      "ShowNamespacesCommand", "ShowColumns", "ShowColumnsCommand", "ShowDeltaTableColumnsCommand", "ShowFunctions",
      "ShowFunctionsCommand", "ShowCreateTable", "ShowCreateTableCommand", "ShowCreateTableAsSerdeCommand",
      "ShowTableProperties", "ShowTablePropertiesCommand", "ShowPartitions", "ShowPartitionsCommand",
      "ShowDeltaPartitionsCommand", "ShowViews", "ShowViewsCommand", "ShowCatalogsCommand", "ShowCurrentNamespace",
      "ShowCurrentNamespaceCommand",
      // DESCRIBE ..., EXPLAIN ...
      "DescribeRelation", "DescribeTableCommand", "DescribeRelationJsonCommand", "DescribeColumn",
      "DescribeColumnCommand", "DescribeNamespace", "DescribeDatabaseCommand", "DescribeFunction",
      "DescribeFunctionCommand", "DescribeQueryCommand", "DescribeDeltaHistory", "DescribeDeltaHistoryCommand",
      "DescribeDeltaDetailCommand", "ExplainCommand",
      // Judged by their arguments below.
      "SetCommand", "ResetCommand", "CreateViewCommand");

  /** Plans that are no Command (or not yet one) but write or change state. */
  static final Set<String> WRITES = Set.of(
      "InsertIntoStatement", "InsertIntoDir", "WriteToStream", "WriteToStreamStatement", "WriteToMicroBatchDataSource",
      "DeltaMergeInto", "DeltaUpdateTable", "DeltaDelete", "MergeIntoTable", "UpdateTable", "DeleteFromTable");

  /** Plans that run a JVM function given with the plan (typed Dataset operations) or R code. */
  static final Set<String> FUNCTION_PLANS = Set.of(
      "MapPartitions", "MapPartitionsInR", "MapPartitionsInRWithArrow", "MapElements", "TypedFilter", "AppendColumns",
      "AppendColumnsWithObject", "MapGroups", "FlatMapGroupsWithState", "FlatMapGroupsInR",
      "FlatMapGroupsInRWithArrow", "CoGroup", "TransformWithState");

  /** Functions of Delta's own queries (its log replay runs typed operations and UDFs): these pass. */
  private static final List<String> DELTA_PACKAGES = List.of("org.apache.spark.sql.delta.", "io.delta.");

  private final SparkSession session;

  ReadOnlyCheck(SparkSession session) {
    this.session = session;
  }

  @Override
  public BoxedUnit apply(LogicalPlan plan) {
    if (ReadOnlyExtension.enforced()) {
      String why = session == null ? null
          : settingsRefusal(session.sessionState().conf().getAllConfs(), this::serverSetting);
      if (why == null) {
        why = refusal(plan);
      }
      if (why != null) {
        LOG.warn("refused: {}", why);
        throw ReadOnlyCheck.<RuntimeException>unchecked(violation(why));
      }
    }
    return BoxedUnit.UNIT;
  }

  /**
   * Null when every setting of a client's session is what the endpoint started with or one a client may change
   * ({@link ReadOnlyExtension#sessionSetting}), else the refusal's message. A session's settings can change
   * without a plan: the Thrift server applies the ones a JDBC URL carries ({@code ;?key=value}, {@code #var=value})
   * when it opens the session, and every one of them also reaches the session's Hadoop conf (file systems,
   * credentials providers). A session carrying such a setting gets no answer to any query.
   */
  static String settingsRefusal(scala.collection.immutable.Map<String, String> settings,
      java.util.function.Function<String, String> serverSetting) {
    java.util.Map<String, String> start = ReadOnlyExtension.startSettings();
    for (java.util.Map.Entry<String, String> setting : CollectionConverters.asJava(settings).entrySet()) {
      String key = setting.getKey();
      String value = setting.getValue();
      if (!java.util.Objects.equals(start.get(key), value) && !java.util.Objects.equals(serverSetting.apply(key), value)
          && !ReadOnlyExtension.sessionSetting(key) && !ReadOnlyExtension.SERVER_SESSION_KEYS.contains(key)) {
        return ReadOnlyExtension.message("the setting " + key + " of this session (given outside SET, e.g. in a JDBC URL)",
            "a session keeps the endpoint's settings but session SQL settings such as spark.sql.session.timeZone; "
                + ReadOnlyExtension.ONLY_QUERIES);
      }
    }
    return null;
  }

  /**
   * The endpoint's own value of {@code key} outside its SQL settings: its Hadoop conf (where HiveServer2's settings
   * are) or a JVM system property. The Thrift server copies its own HiveConf changes into every session it opens.
   */
  private String serverSetting(String key) {
    String value = session.sparkContext().hadoopConfiguration().get(key);
    return value != null ? value : System.getProperty(key);
  }

  /** Throws {@code e} (a checked exception in Java's eyes, as every Spark exception is to Scala) unchanged. */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E unchecked(Throwable e) throws E {
    throw (E) e;
  }

  static AnalysisException violation(String message) {
    return new AnalysisException(message, Option.empty(), Option.empty(), Option.empty(), Option.empty(),
        Map$.MODULE$.empty(), new org.apache.spark.QueryContext[0]);
  }

  /**
   * Null when {@code root} is a read of the kdq tables and views, else the refusal's message. Walks every
   * node, its expressions and the plans of its subqueries; refuses:
   * <ul>
   *   <li>a streaming plan;
   *   <li>every {@code Command} but SHOW, DESCRIBE, EXPLAIN, USE, SET CATALOG, a temporary view, {@code SET}
   *       of a session SQL setting ({@link ReadOnlyExtension#sessionSetting}) or of nothing (listing),
   *       {@code RESET} of a session SQL setting; every write plan that is not yet a Command
   *       (INSERT, MERGE, UPDATE, DELETE, streaming writes), every unresolved statement;
   *   <li>{@code TRANSFORM ... USING} (a script run on the endpoint);
   *   <li>typed Dataset operations with a client's JVM function, and R functions;
   *   <li>reflection ({@code java_method}, {@code reflect}, {@code try_reflect}); Python UDFs, UDAFs and
   *       UDTFs; Scala/Java UDFs and UDAFs (Delta's own pass);
   *   <li>a relation that is no catalog table: files outside the kdq tables' locations ({@code
   *       text.`/etc/passwd`}), JDBC, Kafka and other data sources by format, tables of other catalogs.
   * </ul>
   */
  static String refusal(LogicalPlan root) {
    if (root.isStreaming()) {
      return ReadOnlyExtension.message("a streaming query (" + name(root) + ")");
    }
    Deque<LogicalPlan> plans = new ArrayDeque<>();
    plans.push(root);
    while (!plans.isEmpty()) {
      LogicalPlan node = plans.pop();
      String why = nodeRefusal(node);
      if (why != null) {
        return why;
      }
      if (node instanceof CreateViewCommand view) {
        plans.push(view.plan()); // an AnalysisOnlyCommand: no children once analyzed
      }
      for (LogicalPlan child : CollectionConverters.asJava(node.children())) {
        plans.push(child);
      }
      for (Expression expression : CollectionConverters.asJava(node.expressions())) {
        why = expressionRefusal(expression, plans);
        if (why != null) {
          return why;
        }
      }
    }
    return null;
  }

  private static String nodeRefusal(LogicalPlan node) {
    String name = name(node);
    if (node instanceof Command) {
      if (!ALLOWED_COMMANDS.contains(name)) {
        return ReadOnlyExtension.message(name);
      }
      if (node instanceof SetCommand set) {
        return setRefusal(set.kv());
      }
      if (node instanceof ResetCommand reset) {
        Option<String> key = reset.config();
        return key.isDefined() && ReadOnlyExtension.sessionSetting(key.get())
            ? null
            : ReadOnlyExtension.settingMessage("RESET" + (key.isDefined() ? " " + key.get() : ""));
      }
      if (node instanceof CreateViewCommand view && view.viewType() != LocalTempView$.MODULE$) {
        return ReadOnlyExtension.message(name + " of " + view.viewType() + " " + view.name().unquotedString(),
            "only temporary views; " + ReadOnlyExtension.ONLY_QUERIES);
      }
      return null;
    }
    if (node instanceof ParsedStatement || WRITES.contains(name)) {
      return ReadOnlyExtension.message(name);
    }
    if (node instanceof ScriptTransformation) {
      return ReadOnlyExtension.message("TRANSFORM ... USING (ScriptTransformation)");
    }
    if (FUNCTION_PLANS.contains(name)) {
      Object function = ((scala.Product) node).productElement(0);
      return fromDelta(function) ? null : ReadOnlyExtension.message(name + " with a client's function");
    }
    if (node instanceof LogicalRelation relation) {
      return relationRefusal(relation);
    }
    if (node instanceof DataSourceV2Relation relation) {
      boolean sessionCatalogTable = relation.catalog().isDefined() && relation.identifier().isDefined()
          && "spark_catalog".equals(relation.catalog().get().name());
      return sessionCatalogTable ? null
          : ReadOnlyExtension.message("reading the data source " + relation.table().name() + " (" + name + ")");
    }
    return null;
  }

  private static String setRefusal(Option<Tuple2<String, Option<String>>> kv) {
    if (kv.isEmpty() || kv.get()._2().isEmpty()) {
      return null; // SET, SET -v, SET key: listing and reading
    }
    String key = kv.get()._1();
    return ReadOnlyExtension.sessionSetting(key) ? null : ReadOnlyExtension.settingMessage("SET " + key.trim());
  }

  private static String relationRefusal(LogicalRelation relation) {
    if (relation.catalogTable().isDefined()) {
      return null; // a table of the catalog: only the ones the endpoint registered exist
    }
    if (relation.relation() instanceof HadoopFsRelation files) {
      for (Path path : CollectionConverters.asJava(files.location().rootPaths())) {
        if (!underTableLocation(path.toUri())) {
          return ReadOnlyExtension.message("reading " + path + " (outside the kdq tables' locations)");
        }
      }
      return null;
    }
    return ReadOnlyExtension.message("reading the data source " + relation.relation().getClass().getSimpleName());
  }

  static boolean underTableLocation(URI path) {
    for (URI table : ReadOnlyExtension.tableLocations()) {
      if (same(table.getScheme(), path.getScheme()) && same(table.getAuthority(), path.getAuthority())) {
        String root = trimSlash(table.getPath());
        String p = trimSlash(path.getPath());
        if (root != null && p != null && !p.contains("/../") && !p.endsWith("/..")
            && (p.equals(root) || p.startsWith(root + "/"))) {
          return true;
        }
      }
    }
    return false;
  }

  private static boolean same(String a, String b) {
    String x = a == null || a.isEmpty() ? "" : a.toLowerCase(Locale.ROOT);
    String y = b == null || b.isEmpty() ? "" : b.toLowerCase(Locale.ROOT);
    return x.equals(y);
  }

  private static String trimSlash(String path) {
    if (path == null) {
      return null;
    }
    String p = path;
    while (p.length() > 1 && p.endsWith("/")) {
      p = p.substring(0, p.length() - 1);
    }
    return p;
  }

  private static String expressionRefusal(Expression root, Deque<LogicalPlan> plans) {
    Deque<Expression> expressions = new ArrayDeque<>();
    expressions.push(root);
    while (!expressions.isEmpty()) {
      Expression e = expressions.pop();
      if (e instanceof CallMethodViaReflection || e instanceof TryReflect) {
        return ReadOnlyExtension.message("java_method/reflect/try_reflect (" + name(e) + ")");
      }
      if (e instanceof PythonFuncExpression python) {
        return ReadOnlyExtension.message("the Python function " + python.name() + " (" + name(e) + ")");
      }
      if (e instanceof UserDefinedExpression udf && !fromDelta(udfFunction(e))) {
        return ReadOnlyExtension.message("the user-defined function " + udf.name() + " (" + name(e) + ")");
      }
      if (e instanceof PlanExpression<?> subquery && subquery.plan() instanceof LogicalPlan plan) {
        plans.push(plan);
      }
      for (Expression child : CollectionConverters.asJava(e.children())) {
        expressions.push(child);
      }
    }
    return null;
  }

  private static Object udfFunction(Expression e) {
    if (e instanceof ScalaUDF udf) {
      return udf.function();
    }
    if (e instanceof ScalaUDAF udaf) {
      return udaf.udaf();
    }
    if (e instanceof ScalaAggregator<?, ?, ?> aggregator) {
      return aggregator.agg();
    }
    return e; // any other kind: refused
  }

  private static boolean fromDelta(Object function) {
    if (function == null) {
      return false;
    }
    String cls = function.getClass().getName();
    return DELTA_PACKAGES.stream().anyMatch(cls::startsWith);
  }

  static String name(Object node) {
    String simple = node.getClass().getSimpleName();
    return simple.endsWith("$") ? simple.substring(0, simple.length() - 1) : simple;
  }
}
