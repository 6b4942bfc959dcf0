package io.kdq.spark.sqlendpoint;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.spark.connect.proto.AddArtifactsRequest;
import org.apache.spark.connect.proto.AnalyzePlanRequest;
import org.apache.spark.connect.proto.Catalog;
import org.apache.spark.connect.proto.Command;
import org.apache.spark.connect.proto.CommonInlineUserDefinedFunction;
import org.apache.spark.connect.proto.CommonInlineUserDefinedTableFunction;
import org.apache.spark.connect.proto.ConfigRequest;
import org.apache.spark.connect.proto.CreateDataFrameViewCommand;
import org.apache.spark.connect.proto.DropTable;
import org.apache.spark.connect.proto.ExecutePlanRequest;
import org.apache.spark.connect.proto.Expression;
import org.apache.spark.connect.proto.InterruptRequest;
import org.apache.spark.connect.proto.KeyValue;
import org.apache.spark.connect.proto.ListTables;
import org.apache.spark.connect.proto.MlCommand;
import org.apache.spark.connect.proto.Plan;
import org.apache.spark.connect.proto.Project;
import org.apache.spark.connect.proto.Read;
import org.apache.spark.connect.proto.Relation;
import org.apache.spark.connect.proto.SqlCommand;
import org.apache.spark.connect.proto.WriteOperation;
import org.junit.jupiter.api.Test;

/** The Spark Connect requests the interceptor lets through or refuses, as protos built here. */
class ReadOnlyConnectInterceptorTest {
  private static final Relation TABLE = Relation.newBuilder()
      .setRead(Read.newBuilder().setNamedTable(Read.NamedTable.newBuilder().setUnparsedIdentifier("kdq.window_counts")))
      .build();

  private static ExecutePlanRequest execute(Plan.Builder plan) {
    return ExecutePlanRequest.newBuilder().setSessionId("00112233-4455-6677-8899-aabbccddeeff").setPlan(plan).build();
  }

  private static ExecutePlanRequest query(Relation relation) {
    return execute(Plan.newBuilder().setRoot(relation));
  }

  private static ExecutePlanRequest command(Command.Builder command) {
    return execute(Plan.newBuilder().setCommand(command));
  }

  private static ConfigRequest set(String key, String value) {
    return ConfigRequest.newBuilder().setOperation(ConfigRequest.Operation.newBuilder().setSet(
        ConfigRequest.Set.newBuilder().addPairs(KeyValue.newBuilder().setKey(key).setValue(value)))).build();
  }

  private static AddArtifactsRequest upload(String name) {
    return AddArtifactsRequest.newBuilder().setBatch(AddArtifactsRequest.Batch.newBuilder()
        .addArtifacts(AddArtifactsRequest.SingleChunkArtifact.newBuilder().setName(name))).build();
  }

  private static void refused(Object request, String expected) {
    String why = ReadOnlyConnectInterceptor.refusal(request);
    assertTrue(why != null && why.startsWith(ReadOnlyExtension.PREFIX) && why.contains(expected), String.valueOf(why));
  }

  @Test
  void queriesAndSqlPass() {
    assertNull(ReadOnlyConnectInterceptor.refusal(query(TABLE)));
    assertNull(ReadOnlyConnectInterceptor.refusal(
        command(Command.newBuilder().setSqlCommand(SqlCommand.newBuilder().setSql("SELECT 1")))));
    assertNull(ReadOnlyConnectInterceptor.refusal(command(Command.newBuilder().setCreateDataframeView(
        CreateDataFrameViewCommand.newBuilder().setInput(TABLE).setName("mine").setReplace(true)))));
    assertNull(ReadOnlyConnectInterceptor.refusal(AnalyzePlanRequest.newBuilder()
        .setSchema(AnalyzePlanRequest.Schema.newBuilder().setPlan(Plan.newBuilder().setRoot(TABLE))).build()));
    assertNull(ReadOnlyConnectInterceptor.refusal(query(Relation.newBuilder()
        .setCatalog(Catalog.newBuilder().setListTables(ListTables.newBuilder().setDbName("kdq"))).build())));
    assertNull(ReadOnlyConnectInterceptor.refusal(InterruptRequest.newBuilder().build()));
  }

  @Test
  void writesAndOtherCommandsAreRefused() {
    refused(command(Command.newBuilder().setWriteOperation(WriteOperation.newBuilder().setInput(TABLE).setPath("/tmp/x"))),
        "the Spark Connect command WRITE_OPERATION is not allowed");
    refused(command(Command.newBuilder().setMlCommand(MlCommand.newBuilder())), "ML_COMMAND");
    refused(command(Command.newBuilder().setCreateDataframeView(
        CreateDataFrameViewCommand.newBuilder().setInput(TABLE).setName("g").setIsGlobal(true))), "global temporary view");
    refused(AnalyzePlanRequest.newBuilder()
        .setPersist(AnalyzePlanRequest.Persist.newBuilder().setRelation(TABLE)).build(), "persist");
    refused(query(Relation.newBuilder()
        .setCatalog(Catalog.newBuilder().setDropTable(DropTable.newBuilder().setTableName("kdq.window_counts"))).build()),
        "the catalog call DROP_TABLE");
  }

  @Test
  void clientCodeAndDataSourcesAreRefusedAnywhereInAPlan() {
    Relation udf = Relation.newBuilder().setProject(Project.newBuilder().setInput(TABLE).addExpressions(
        Expression.newBuilder().setCommonInlineUserDefinedFunction(
            CommonInlineUserDefinedFunction.newBuilder().setFunctionName("steal")))).build();
    refused(query(udf), "a user-defined function of the client");
    // Also inside SQL's arguments and under a schema request.
    refused(AnalyzePlanRequest.newBuilder()
        .setSchema(AnalyzePlanRequest.Schema.newBuilder().setPlan(Plan.newBuilder().setRoot(udf))).build(),
        "user-defined function");
    refused(query(Relation.newBuilder().setCommonInlineUserDefinedTableFunction(
        CommonInlineUserDefinedTableFunction.newBuilder().setFunctionName("t")).build()), "table function");
    Relation jdbc = Relation.newBuilder().setRead(Read.newBuilder().setDataSource(Read.DataSource.newBuilder()
        .setFormat("jdbc").putOptions("url", "jdbc:derby:/tmp/x;create=true"))).build();
    refused(query(jdbc), "reading a data source by format or path (jdbc)");
    // Deep plans are walked without recursion.
    Relation deep = TABLE;
    for (int i = 0; i < 5000; i++) {
      deep = Relation.newBuilder().setProject(Project.newBuilder().setInput(deep)).build();
    }
    assertNull(ReadOnlyConnectInterceptor.refusal(query(deep)));
  }

  @Test
  void configurationTakesOnlySessionSqlSettings() {
    assertNull(ReadOnlyConnectInterceptor.refusal(set("spark.sql.session.timeZone", "UTC")));
    refused(set("spark.kdq.sql.readOnly", "false"), "setting spark.kdq.sql.readOnly is not allowed");
    refused(set("spark.sql.catalog.evil", "org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog"),
        "spark.sql.catalog.evil");
    refused(set("spark.hadoop.fs.s3a.endpoint", "http://elsewhere"), "spark.hadoop.fs.s3a.endpoint");
    refused(ConfigRequest.newBuilder().setOperation(ConfigRequest.Operation.newBuilder()
        .setUnset(ConfigRequest.Unset.newBuilder().addKeys("spark.sql.extensions"))).build(), "unsetting");
    assertNull(ReadOnlyConnectInterceptor.refusal(ConfigRequest.newBuilder().setOperation(ConfigRequest.Operation
        .newBuilder().setGetAll(ConfigRequest.GetAll.newBuilder())).build()));
  }

  @Test
  void aRefusalCarriesTheRichStatusPySparkTurnsIntoAnAnalysisException() throws Exception {
    String why = ReadOnlyExtension.message("the Spark Connect command WRITE_OPERATION");
    var refusal = ReadOnlyConnectInterceptor.refusalStatus(why);
    assertEquals(org.sparkproject.connect.grpc.Status.Code.PERMISSION_DENIED, refusal.getStatus().getCode());
    assertEquals(why, refusal.getStatus().getDescription());
    var rich = org.sparkproject.connect.grpc.protobuf.StatusProto.fromThrowable(refusal);
    assertEquals(why, rich.getMessage()); // PySpark checks that code and message agree with the call's
    var info = rich.getDetails(0).unpack(org.sparkproject.connect.google_protos.rpc.ErrorInfo.class);
    assertEquals("[\"org.apache.spark.sql.AnalysisException\"]", info.getMetadataOrThrow("classes"));
  }

  @Test
  void onlyCachedDataMayBeUploaded() {
    assertNull(ReadOnlyConnectInterceptor.refusal(upload("cache/0123456789abcdef")));
    refused(upload("jars/evil.jar"), "uploading the artifact jars/evil.jar");
    refused(upload("classes/Evil.class"), "classes/Evil.class");
    refused(upload("pyfiles/evil.py"), "pyfiles/evil.py");
    refused(upload("cache/../jars/evil.jar"), "cache/../jars/evil.jar");
  }
}
