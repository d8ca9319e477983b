package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Timestamp;
import com.google.protobuf.Value;
import com.google.rpc.BadRequest;
import io.grpc.Status;
import java.nio.file.Path;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import io.ragsidecar.v1.ErrorReason;
import io.ragsidecar.v1.EnforceResponse;
import io.ragsidecar.v1.Param;
import io.ragsidecar.v1.SourceCount;
import io.ragsidecar.v1.StaleFallback;
import io.ragsidecar.v1.ValidateConfigurationResponse;
import io.ragsidecar.v1.Violation;

/** The retrieval facade's conversions and error details, on messages built here (no sidecar). */
class RetrievalMappingTest {

  static BadRequest violations(String... fieldDescription) {
    BadRequest.Builder b = BadRequest.newBuilder();
    for (int i = 0; i < fieldDescription.length; i += 2) {
      b.addFieldViolations(BadRequest.FieldViolation.newBuilder().setField(fieldDescription[i])
          .setDescription(fieldDescription[i + 1]));
    }
    return b.build();
  }

  @Test
  void knowledgeNotReadyNamesItsSourcesAndWhy() {
    KnowledgeNotReadyException e = assertInstanceOf(KnowledgeNotReadyException.class, ErrorDetails.toException(
        ErrorMappingTest.wire(Status.Code.FAILED_PRECONDITION, "KNOWLEDGE_NOT_READY", Map.of("sources", "alpha,zeta"),
            violations("knowledge[alpha]", "holds no unit", "knowledge[zeta]", "empty file"))));
    assertEquals(List.of("alpha", "zeta"), e.sources());
    assertEquals(List.of(new ValidationException.FieldViolation("knowledge[alpha]", "holds no unit"),
        new ValidationException.FieldViolation("knowledge[zeta]", "empty file")), e.violations());
  }

  @Test
  void failedPreconditionReasonsKeepTheirSources() {
    for (String reason : List.of(FailedPreconditionException.DIRECT_BUDGET_EXCEEDED,
        FailedPreconditionException.UNKNOWN_MODEL_WINDOW, FailedPreconditionException.SOURCE_UNREADABLE)) {
      RagSidecarException e = ErrorDetails.toException(ErrorMappingTest.wire(Status.Code.FAILED_PRECONDITION, reason,
          Map.of("sources", "big,huge"), null));
      FailedPreconditionException f = assertInstanceOf(FailedPreconditionException.class, e);
      assertFalse(f instanceof KnowledgeNotReadyException);
      assertEquals(reason, f.reason());
      assertEquals(List.of("big", "huge"), f.sources());
      assertEquals(List.of(), f.violations());
    }
    FailedPreconditionException none = assertInstanceOf(FailedPreconditionException.class, ErrorDetails.toException(
        ErrorMappingTest.wire(Status.Code.FAILED_PRECONDITION, "UNKNOWN_MODEL_WINDOW", Map.of(), null)));
    assertEquals(List.of(), none.sources());
  }

  @Test
  void permissionDeniedTellsPathOutsideRootsApart() {
    PermissionDeniedException outside = assertInstanceOf(PermissionDeniedException.class, ErrorDetails.toException(
        ErrorMappingTest.wire(Status.Code.PERMISSION_DENIED, "PATH_OUTSIDE_ROOTS", Map.of(), null)));
    assertTrue(outside.isPathOutsideRoots());
    PermissionDeniedException denied = assertInstanceOf(PermissionDeniedException.class, ErrorDetails.toException(
        ErrorMappingTest.wire(Status.Code.PERMISSION_DENIED, "PERMISSION_DENIED", Map.of(), null)));
    assertFalse(denied.isPathOutsideRoots());
    UnknownModelException model = assertInstanceOf(UnknownModelException.class, ErrorDetails.toException(
        ErrorMappingTest.wire(Status.Code.NOT_FOUND, "UNKNOWN_MODEL", Map.of("model", "r"), null)));
    assertEquals("r", model.model());
  }

  @Test
  void validationViolationsCarryReasonNamesWithoutPrefix() {
    ConfigurationValidation v = ConfigurationValidation.fromProto(ValidateConfigurationResponse.newBuilder()
        .addViolations(Violation.newBuilder().setField("target.knowledge[1].path")
            .setReason(ErrorReason.ERROR_REASON_PATH_OUTSIDE_ROOTS).setDescription("outside"))
        .addViolations(Violation.newBuilder().setField("llm").setReasonValue(99).setDescription("future"))
        .build());
    assertFalse(v.valid());
    assertEquals(List.of(new ConfigurationValidation.Violation("target.knowledge[1].path", "PATH_OUTSIDE_ROOTS",
        "outside"), new ConfigurationValidation.Violation("llm", "ERROR_REASON_99", "future")), v.violations());
  }

  @Test
  void enforceResponseMapsToTheHostContextValues() {
    RetrievedContext c = RetrievedContext.fromProto(EnforceResponse.newBuilder().setRetrievedContext("ctx")
        .setDocumentCount(3).setTruncated(true).setQuery("q")
        .addStaleFallbacks(StaleFallback.newBuilder().setSource("docs").setReason("gone")
            .setLastGoodBuiltAt(Timestamp.newBuilder().setSeconds(1_700_000_000L).setNanos(5)))
        .build());
    assertEquals("ctx", c.retrievedContext());
    assertEquals(3, c.documentCount());
    assertTrue(c.truncated());
    assertEquals(List.of(new RetrievedContext.StaleFallback("docs", "gone", Instant.ofEpochSecond(1_700_000_000L, 5))),
        c.staleFallbacks());
    assertEquals(List.of("docs"), c.staleSources());
    assertFalse(c.isEmpty());
  }

  @Test
  void countsKeepTheServersOrder() {
    LinkedHashMap<String, Integer> counts = SidecarRetrieval.counts(List.of(
        SourceCount.newBuilder().setName("b").setCount(2).build(),
        SourceCount.newBuilder().setName("a").setCount(1).build()));
    assertEquals(List.of("b", "a"), new ArrayList<>(counts.keySet()));
  }

  @Test
  void paramsConvertLikeJsonAndOnlyStringsBecomeStrings() {
    Map<String, Object> in = new LinkedHashMap<>();
    in.put("n", 3);
    in.put("flag", true);
    in.put("none", null);
    in.put("tags", List.of("a", 1));
    in.put("array", new Object[] {"x"});
    in.put("map", Map.of("k", "v"));
    in.put("kind", Thread.State.NEW);
    in.put("object", new Object());
    in.put("question", new StringBuilder("why?"));
    List<Param> params = RetrievalRequests.params(in);
    assertEquals(List.copyOf(in.keySet()), params.stream().map(Param::getName).toList());
    List<Value.KindCase> kinds = params.stream().map(p -> p.getValue().getKindCase()).toList();
    assertEquals(Arrays.asList(Value.KindCase.NUMBER_VALUE, Value.KindCase.BOOL_VALUE, Value.KindCase.NULL_VALUE,
        Value.KindCase.LIST_VALUE, Value.KindCase.LIST_VALUE, Value.KindCase.STRUCT_VALUE, Value.KindCase.NULL_VALUE,
        Value.KindCase.NULL_VALUE, Value.KindCase.STRING_VALUE), kinds);
    assertEquals("why?", params.get(8).getValue().getStringValue());
  }

  @Test
  void knowledgeScopeBuildsPrincipalAndScope() {
    KnowledgeScope scope = new KnowledgeScope("host", "acme", null, List.of("reader"));
    assertEquals("", scope.session());
    assertEquals("host", scope.principal().getId());
    assertEquals(List.of("reader"), scope.principal().getRolesList());
    assertEquals("acme", scope.scope().getTenant());
    assertEquals("s2", scope.withSession("s2").scope().getSession());
    assertEquals("", KnowledgeScope.tenantWide("host", "acme").session());
  }

  @Test
  void theTestConfigurationReplacesOnlyThePathKeys() {
    String toml = "[server]\nport = 1\n\n[paths]\nmodels_dir = \"../models\"\ndata_dir = \"../data\"   # c\n"
        + "knowledge_roots = [\"../knowledge\"]\n\n[retrieval]\ndata_dir_like = 1\n";
    String out = Sidecar.withOwnPaths(toml, Path.of("/tmp/w"));
    assertTrue(out.contains("data_dir = \"/tmp/w/data\"\n"), out);
    assertTrue(out.contains("knowledge_roots = [\"/tmp/w/knowledge\"]\n"), out);
    assertTrue(out.contains("models_dir = \"" + Sidecar.repoRoot().resolve("models") + "\"\n"), out);
    assertTrue(out.contains("[retrieval]\ndata_dir_like = 1\n"), out);
    assertFalse(out.contains("../"), out);
  }
}
