package io.kdq.spark.sqlendpoint;

import java.util.ArrayDeque;
import java.util.Deque;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.connect.proto.AddArtifactsRequest;
import org.apache.spark.connect.proto.AnalyzePlanRequest;
import org.apache.spark.connect.proto.Catalog;
import org.apache.spark.connect.proto.Command;
import org.apache.spark.connect.proto.ConfigRequest;
import org.apache.spark.connect.proto.ExecutePlanRequest;
import org.apache.spark.connect.proto.Plan;
import org.apache.spark.connect.proto.Read;
import org.apache.spark.sql.connect.utils.PlanCompressionUtils$;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.sparkproject.connect.grpc.ForwardingServerCallListener;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.ServerCall;
import org.sparkproject.connect.grpc.ServerCallHandler;
import org.sparkproject.connect.grpc.ServerInterceptor;
import org.sparkproject.connect.google_protos.rpc.ErrorInfo;
import org.sparkproject.connect.grpc.Status;
import org.sparkproject.connect.grpc.StatusRuntimeException;
import org.sparkproject.connect.grpc.protobuf.StatusProto;
import org.sparkproject.connect.protobuf.Any;
import org.sparkproject.connect.protobuf.Descriptors;
import org.sparkproject.connect.protobuf.Message;

/**
 * The Spark Connect side of {@link ReadOnlyExtension} ({@code
 * spark.connect.grpc.interceptor.classes=io.kdq.spark.sqlendpoint.ReadOnlyConnectInterceptor}): refuses, with gRPC
 * status PERMISSION_DENIED and a message starting with {@link ReadOnlyExtension#PREFIX}, the requests
 * that would change something without ever becoming an analyzed plan, so that the check rule cannot see
 * them:
 * <ul>
 *   <li>every command but SQL, a local temporary view of a DataFrame and two bookkeeping commands: no
 *       DataFrame writes, MERGE, streaming, checkpoints, function, table-function or data-source
 *       registration, ML (fitting and saving models writes files), pipelines, external commands;
 *   <li>{@code persist}/{@code cache} (the cache is shared by every session and would serve stale counts);
 *   <li>catalog calls that create, drop, cache, refresh, repair, truncate or analyze;
 *   <li>reads of a data source by format or path ({@code spark.read.format(...).load(...)}: a JDBC source
 *       connects while the plan is only being resolved; tables are read by name);
 *   <li>Python, Scala and Java functions of the client (UDFs, UDTFs, {@code mapInPandas}, ...) and ML
 *       relations anywhere in a plan;
 *   <li>configuration calls that set or unset anything but a session SQL setting ({@code
 *       spark.conf.set("spark.sql.catalog.x", ...)} would load a class);
 *   <li>artifact uploads other than the client's cached local data (no jars, classes, Python files,
 *       archives or files).
 * </ul>
 * Queries, SQL (judged by the check rule), schema/explain requests and reads of the configuration pass.
 */
public final class ReadOnlyConnectInterceptor implements ServerInterceptor {
  private static final Logger LOG = LoggerFactory.getLogger(ReadOnlyConnectInterceptor.class);

  static final Set<Command.CommandTypeCase> ALLOWED_COMMANDS = EnumSet.of(
      Command.CommandTypeCase.SQL_COMMAND, Command.CommandTypeCase.CREATE_DATAFRAME_VIEW,
      Command.CommandTypeCase.GET_RESOURCES_COMMAND, Command.CommandTypeCase.REMOVE_CACHED_REMOTE_RELATION_COMMAND);

  static final Set<Catalog.CatTypeCase> ALLOWED_CATALOG_CALLS = EnumSet.of(
      Catalog.CatTypeCase.CURRENT_DATABASE, Catalog.CatTypeCase.SET_CURRENT_DATABASE,
      Catalog.CatTypeCase.LIST_DATABASES, Catalog.CatTypeCase.LIST_TABLES, Catalog.CatTypeCase.LIST_FUNCTIONS,
      Catalog.CatTypeCase.LIST_COLUMNS, Catalog.CatTypeCase.GET_DATABASE, Catalog.CatTypeCase.GET_TABLE,
      Catalog.CatTypeCase.GET_FUNCTION, Catalog.CatTypeCase.DATABASE_EXISTS, Catalog.CatTypeCase.TABLE_EXISTS,
      Catalog.CatTypeCase.FUNCTION_EXISTS, Catalog.CatTypeCase.IS_CACHED, Catalog.CatTypeCase.CURRENT_CATALOG,
      Catalog.CatTypeCase.SET_CURRENT_CATALOG, Catalog.CatTypeCase.LIST_CATALOGS, Catalog.CatTypeCase.LIST_PARTITIONS,
      Catalog.CatTypeCase.LIST_VIEWS, Catalog.CatTypeCase.GET_TABLE_PROPERTIES,
      Catalog.CatTypeCase.GET_CREATE_TABLE_STRING, Catalog.CatTypeCase.DROP_TEMP_VIEW);

  /** Messages that carry a client's code, wherever they are in a plan. */
  static final Map<String, String> CODE_MESSAGES = Map.of(
      "spark.connect.CommonInlineUserDefinedFunction", "a user-defined function of the client",
      "spark.connect.CommonInlineUserDefinedTableFunction", "a user-defined table function of the client",
      "spark.connect.CommonInlineUserDefinedDataSource", "a Python data source of the client",
      "spark.connect.MlRelation", "an ML relation",
      "spark.connect.MlCommand", "an ML command");

  /** Artifact names a client may upload: its cached local relations (data, not code). */
  static final String DATA_ARTIFACTS = "cache/";

  @Override
  public <ReqT, RespT> ServerCall.Listener<ReqT> interceptCall(
      ServerCall<ReqT, RespT> call, Metadata headers, ServerCallHandler<ReqT, RespT> next) {
    ServerCall.Listener<ReqT> delegate = next.startCall(call, headers);
    return new ForwardingServerCallListener.SimpleForwardingServerCallListener<>(delegate) {
      private boolean refused;

      @Override
      public void onMessage(ReqT message) {
        if (refused) {
          return;
        }
        String why;
        try {
          why = refusal(message);
        } catch (RuntimeException e) {
          why = ReadOnlyExtension.message("a request the endpoint could not inspect (" + e + ")");
        }
        if (why == null) {
          super.onMessage(message);
          return;
        }
        refused = true;
        LOG.warn("refused ({}): {}", call.getMethodDescriptor().getFullMethodName(), why);
        StatusRuntimeException refusal = refusalStatus(why);
        call.close(refusal.getStatus(), refusal.getTrailers());
      }

      @Override
      public void onHalfClose() {
        if (!refused) {
          super.onHalfClose();
        }
      }

      @Override
      public void onReady() {
        if (!refused) {
          super.onReady();
        }
      }
    };
  }

  /**
   * PERMISSION_DENIED with {@code why} as its description, and the rich status Spark Connect's clients read:
   * an ErrorInfo naming {@code AnalysisException}, so PySpark raises the same exception class, with the same
   * message, as for a refusal of the check rule (not a bare gRPC error).
   */
  static StatusRuntimeException refusalStatus(String why) {
    ErrorInfo info = ErrorInfo.newBuilder()
        .setDomain("io.kdq.spark")
        .setReason("KDQ_SQL_ENDPOINT_READ_ONLY")
        .putMetadata("classes", "[\"org.apache.spark.sql.AnalysisException\"]")
        .build();
    org.sparkproject.connect.google_protos.rpc.Status status = org.sparkproject.connect.google_protos.rpc.Status
        .newBuilder()
        .setCode(Status.Code.PERMISSION_DENIED.value())
        .setMessage(why)
        .addDetails(Any.pack(info))
        .build();
    return StatusProto.toStatusRuntimeException(status);
  }

  /** Null when {@code request} may pass, else the message of its refusal. */
  static String refusal(Object request) {
    if (request instanceof ExecutePlanRequest execute) {
      return planRefusal(execute.getPlan());
    }
    if (request instanceof AnalyzePlanRequest analyze) {
      if (analyze.getAnalyzeCase() == AnalyzePlanRequest.AnalyzeCase.PERSIST) {
        return ReadOnlyExtension.message("persist/cache of a DataFrame");
      }
      return walk(analyze); // schema, explain, ...: resolving a plan can already act (a JDBC source connects)
    }
    if (request instanceof ConfigRequest config) {
      return configRefusal(config.getOperation());
    }
    if (request instanceof AddArtifactsRequest artifacts) {
      return artifactRefusal(artifacts);
    }
    return null;
  }

  private static String planRefusal(Plan plan) {
    if (plan.getOpTypeCase() == Plan.OpTypeCase.COMPRESSED_OPERATION) {
      plan = PlanCompressionUtils$.MODULE$.decompressPlan(plan);
    }
    if (plan.hasCommand()) {
      Command.CommandTypeCase kind = plan.getCommand().getCommandTypeCase();
      if (!ALLOWED_COMMANDS.contains(kind)) {
        return ReadOnlyExtension.message("the Spark Connect command " + kind);
      }
      if (plan.getCommand().hasCreateDataframeView() && plan.getCommand().getCreateDataframeView().getIsGlobal()) {
        return ReadOnlyExtension.message("a global temporary view", "only temporary views; " + ReadOnlyExtension.ONLY_QUERIES);
      }
    }
    return walk(plan);
  }

  /** Looks at every message inside {@code root} (iteratively: plans can be deep). */
  static String walk(Message root) {
    Deque<Message> messages = new ArrayDeque<>();
    messages.push(root);
    while (!messages.isEmpty()) {
      Message m = messages.pop();
      String type = m.getDescriptorForType().getFullName();
      String code = CODE_MESSAGES.get(type);
      if (code != null) {
        return ReadOnlyExtension.message(code);
      }
      if (m instanceof Read read && read.hasDataSource()) {
        String format = read.getDataSource().hasFormat() ? read.getDataSource().getFormat() : "default";
        return ReadOnlyExtension.message("reading a data source by format or path (" + format + ")",
            "read the kdq tables and views by name; " + ReadOnlyExtension.ONLY_QUERIES);
      }
      if (m instanceof Catalog catalog && !ALLOWED_CATALOG_CALLS.contains(catalog.getCatTypeCase())) {
        return ReadOnlyExtension.message("the catalog call " + catalog.getCatTypeCase());
      }
      for (Map.Entry<Descriptors.FieldDescriptor, Object> field : m.getAllFields().entrySet()) {
        if (field.getKey().getJavaType() != Descriptors.FieldDescriptor.JavaType.MESSAGE) {
          continue;
        }
        if (field.getValue() instanceof List<?> list) {
          for (Object item : list) {
            messages.push((Message) item);
          }
        } else {
          messages.push((Message) field.getValue());
        }
      }
    }
    return null;
  }

  private static String configRefusal(ConfigRequest.Operation operation) {
    switch (operation.getOpTypeCase()) {
      case SET:
        for (var pair : operation.getSet().getPairsList()) {
          if (!ReadOnlyExtension.sessionSetting(pair.getKey())) {
            return ReadOnlyExtension.settingMessage("setting " + pair.getKey());
          }
        }
        return null;
      case UNSET:
        for (String key : operation.getUnset().getKeysList()) {
          if (!ReadOnlyExtension.sessionSetting(key)) {
            return ReadOnlyExtension.settingMessage("unsetting " + key);
          }
        }
        return null;
      default:
        return null; // reads
    }
  }

  private static String artifactRefusal(AddArtifactsRequest request) {
    switch (request.getPayloadCase()) {
      case BATCH:
        for (var artifact : request.getBatch().getArtifactsList()) {
          if (!dataArtifact(artifact.getName())) {
            return ReadOnlyExtension.message("uploading the artifact " + artifact.getName());
          }
        }
        return null;
      case BEGIN_CHUNK:
        String name = request.getBeginChunk().getName();
        return dataArtifact(name) ? null : ReadOnlyExtension.message("uploading the artifact " + name);
      default:
        return null; // further chunks of an artifact whose first chunk passed
    }
  }

  private static boolean dataArtifact(String name) {
    return name.startsWith(DATA_ARTIFACTS) && !name.contains("..");
  }
}
