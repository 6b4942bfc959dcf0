package io.kdq.spark.sqlendpoint;

import java.net.URI;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.catalyst.catalog.SessionCatalog;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.internal.SQLConf$;
import scala.Function1;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * Makes the SQL endpoint read-only: a Spark session extension ({@code spark.sql.extensions}, beside
 * Delta's) whose check rule ({@link ReadOnlyCheck}) refuses, in every session of the endpoint's driver,
 * each analyzed plan that writes or changes state or runs code a client brought: DDL and DML commands
 * (Spark's and Delta's), {@code ADD JAR}, {@code CREATE FUNCTION}, {@code CACHE TABLE}, {@code SET} of
 * anything but a session SQL setting, {@code RESET}, streaming queries, reflective functions ({@code
 * java_method}, {@code reflect}, {@code try_reflect}), {@code TRANSFORM ... USING} scripts, Python and
 * Scala UDFs, and reads of files or data sources outside the locations of the tables registered at
 * start-up. Queries of those tables and views, SHOW, DESCRIBE, EXPLAIN, {@code USE}, temporary views
 * and {@code SET} of session SQL settings pass. Spark Connect requests that never become an analyzed
 * plan (configuration calls, artifact uploads, catalog calls, ML, caching) are checked by {@link
 * ReadOnlyConnectInterceptor}.
 *
 * <p>The rule starts refusing once {@link #enforce} is called: the endpoint creates and registers its
 * tables and views on its own session first, then calls it before either server opens its port. The
 * switch is JVM-wide and one-way: there is no conf key behind it, so no client {@code SET} (or Spark
 * Connect config call) can turn it off, and every session, the endpoint's own and each client's new
 * session alike, is read-only from then on.
 *
 * <p>A refusal is an {@code AnalysisException} whose message starts with {@link #PREFIX} and names
 * what was refused, e.g. {@code kdq SQL endpoint is read-only: DropTable is not allowed (only queries of
 * the kdq tables and views)}.
 */
public final class ReadOnlyExtension implements Function1<SparkSessionExtensions, BoxedUnit> {
  public static final String PREFIX = "kdq SQL endpoint is read-only: ";
  static final String ONLY_QUERIES = "only queries of the kdq tables and views";
  /**
   * Off on the endpoint, and not a client's to turn on: {@code ${key}} in SQL text would read any setting of the
   * session, including the server's own that the Thrift server copies into each of its sessions (its TLS keystore's
   * password), past Spark's redaction of {@code SET} output.
   */
  static final String VARIABLE_SUBSTITUTE = "spark.sql.variable.substitute";
  /** Settings under this prefix belong to kdq; none of them is a client's to change. */
  static final String KDQ_KEYS = "spark.kdq.";

  private static volatile boolean enforced;
  private static volatile List<URI> tableLocations = List.of();
  /** The endpoint's own session settings when it was armed: what every client session starts with. */
  private static volatile Map<String, String> startSettings = Map.of();

  /**
   * Settings a server sets in a client's session itself, outside any SQL: beeline's fetch size (the Hive
   * JDBC driver sends it with every session it opens). Hive settings, read by no Spark code path of a query.
   */
  static final Set<String> SERVER_SESSION_KEYS = Set.of("hive.server2.thrift.resultset.default.fetch.size");

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    // One rule per session (each client's session state is built with its own): it judges that session's settings.
    extensions.injectCheckRule(session -> new ReadOnlyCheck((SparkSession) session)); // a classic session
    return BoxedUnit.UNIT;
  }

  /**
   * Start refusing, in every session of this JVM, and remember where the tables registered in {@code
   * session}'s catalog keep their files (reads of files under those locations, such as Delta's own reads
   * of a table's log, stay allowed; no table can be created afterwards). Then checks, on a new session,
   * that the rule is really installed (the extension in {@code spark.sql.extensions}): otherwise an
   * IllegalStateException, so an endpoint without the rule does not start.
   *
   * @return a line for the log, e.g. "read-only: 6 table locations"
   */
  public static synchronized String enforce(SparkSession session) {
    List<URI> locations;
    try {
      locations = locations(session.sessionState().catalog());
    } catch (Exception e) {
      throw new IllegalStateException("could not list the tables' locations: " + e, e);
    }
    tableLocations = List.copyOf(locations);
    startSettings = Map.copyOf(CollectionConverters.asJava(session.sessionState().conf().getAllConfs()));
    enforced = true;
    String probe = "SET " + KDQ_KEYS + "sql.readOnly=false";
    try {
      session.newSession().sql(probe);
    } catch (Exception e) {
      if (String.valueOf(e.getMessage()).contains(PREFIX)) {
        return "read-only: " + locations.size() + " table locations";
      }
      throw new IllegalStateException("the read-only check did not refuse `" + probe + "`: " + e, e);
    }
    throw new IllegalStateException("the read-only check is not installed: add " + ReadOnlyExtension.class.getName()
        + " to spark.sql.extensions (`" + probe + "` was accepted)");
  }

  private static List<URI> locations(SessionCatalog catalog) throws Exception {
    List<URI> locations = new ArrayList<>();
    for (String db : scala.jdk.javaapi.CollectionConverters.asJava(catalog.listDatabases())) {
      for (TableIdentifier id : scala.jdk.javaapi.CollectionConverters.asJava(catalog.listTables(db))) {
        if (id.database().isEmpty()) {
          continue; // a temporary view
        }
        CatalogTable table = catalog.getTableMetadata(id);
        if (table.storage().locationUri().isDefined()) {
          locations.add(table.storage().locationUri().get());
        }
      }
    }
    return locations;
  }

  /** Whether {@link #enforce} was called in this JVM. */
  public static boolean enforced() {
    return enforced;
  }

  static List<URI> tableLocations() {
    return tableLocations;
  }

  static Map<String, String> startSettings() {
    return startSettings;
  }

  /** For tests: locations without a catalog. */
  static synchronized void enforceWith(List<URI> locations) {
    tableLocations = List.copyOf(locations);
    enforced = true;
  }

  /** The message of a refusal of {@code what}. */
  static String message(String what, String allowed) {
    return PREFIX + what + " is not allowed (" + allowed + ")";
  }

  static String message(String what) {
    return message(what, ONLY_QUERIES);
  }

  /**
   * Whether a client may change {@code key} in its own session (SQL {@code SET}/{@code RESET}, Spark
   * Connect's {@code spark.conf.set}): a registered, non-static Spark SQL setting ({@code spark.sql.*},
   * e.g. {@code spark.sql.session.timeZone}, {@code spark.sql.ansi.enabled}), but no catalog plugin
   * ({@code spark.sql.catalog.*} names a class to load), no redaction pattern and not {@link
   * #VARIABLE_SUBSTITUTE}. Never a static
   * setting, Spark core or Hadoop setting, {@code spark.sql.extensions} or kdq's own keys.
   */
  static boolean sessionSetting(String key) {
    if (key == null) {
      return false;
    }
    String k = key.trim();
    if (!k.startsWith("spark.sql.") || k.startsWith("spark.sql.catalog.") || k.startsWith("spark.sql.redaction.")
        || k.equals(VARIABLE_SUBSTITUTE)) {
      return false;
    }
    SQLConf$ conf = SQLConf$.MODULE$;
    return conf.containsConfigKey(k) && !conf.isStaticConfigKey(k);
  }

  static String settingMessage(String statement) {
    return message(statement, "SET takes only session SQL settings such as spark.sql.session.timeZone; " + ONLY_QUERIES);
  }
}
