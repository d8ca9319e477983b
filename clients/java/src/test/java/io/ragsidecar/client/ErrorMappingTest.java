package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.google.protobuf.Any;
import com.google.rpc.BadRequest;
import com.google.rpc.ErrorInfo;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import io.ragsidecar.client.Reranker.Request;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.api.Test;
import io.ragsidecar.v1.RerankResponse;
import io.ragsidecar.v1.RerankResult;

/**
 * Statuses the sidecar sends in situations the live tests cannot provoke cheaply (full queue, model still loading,
 * knowledge not ready, ...), decoded exactly as they arrive on the wire; and the client-side check of the reranker
 * invariant against responses that break it.
 */
class ErrorMappingTest {

  static StatusRuntimeException wire(Status.Code code, String reason, Map<String, String> metadata,
      BadRequest badRequest) {
    com.google.rpc.Status.Builder rich = com.google.rpc.Status.newBuilder().setCode(code.value())
        .setMessage("message of " + reason)
        .addDetails(Any.pack(ErrorInfo.newBuilder().setDomain("ragsidecar.dev").setReason(reason)
            .putAllMetadata(metadata).build()));
    if (badRequest != null) {
      rich.addDetails(Any.pack(badRequest));
    }
    return StatusProto.toStatusRuntimeException(rich.build());
  }

  @ParameterizedTest
  @CsvSource({
      "INVALID_ARGUMENT, INVALID_REQUEST, ValidationException",
      "INVALID_ARGUMENT, LIMIT_EXCEEDED, ValidationException",
      "NOT_FOUND, UNKNOWN_MODEL, UnknownModelException",
      "NOT_FOUND, UNKNOWN_BINDING, UnknownBindingException",
      "NOT_FOUND, UNKNOWN_THING, NotFoundException",
      "FAILED_PRECONDITION, KNOWLEDGE_NOT_READY, KnowledgeNotReadyException",
      "FAILED_PRECONDITION, DIRECT_BUDGET_EXCEEDED, FailedPreconditionException",
      "PERMISSION_DENIED, PATH_OUTSIDE_ROOTS, PermissionDeniedException",
      "UNAUTHENTICATED, UNAUTHENTICATED, UnauthenticatedException",
      "RESOURCE_EXHAUSTED, QUEUE_FULL, ResourceExhaustedException",
      "UNAVAILABLE, MODEL_NOT_READY, ModelNotReadyException",
      "UNAVAILABLE, STORE_UNAVAILABLE, UnavailableException",
      "UNAVAILABLE, WARMING_UP, UnavailableException",
      "DEADLINE_EXCEEDED, DEADLINE_EXCEEDED, DeadlineExceededException",
      "UNIMPLEMENTED, '', RagSidecarException",
      "INTERNAL, '', RagSidecarException",
  })
  void statusCodesAndReasonsMapToTheHierarchy(Status.Code code, String reason, String type) {
    StatusRuntimeException wire = wire(code, reason, Map.of("model", "m"), null);
    RagSidecarException e = ErrorDetails.toException(wire);
    assertEquals(type, e.getClass().getSimpleName());
    assertEquals(code, e.code());
    assertEquals(reason, e.reason());
    assertEquals("ragsidecar.dev", e.domain());
    assertEquals(Map.of("model", "m"), e.metadata());
    assertSame(wire, e.getCause());
    assertSame(e, ErrorDetails.toException(e));
  }

  @Test
  void badRequestViolationsAreKeptInOrder() {
    BadRequest bad = BadRequest.newBuilder()
        .addFieldViolations(BadRequest.FieldViolation.newBuilder().setField("query").setDescription("blank"))
        .addFieldViolations(BadRequest.FieldViolation.newBuilder().setField("top_n").setDescription("negative"))
        .build();
    ValidationException e = assertInstanceOf(ValidationException.class,
        ErrorDetails.toException(wire(Status.Code.INVALID_ARGUMENT, "INVALID_REQUEST", Map.of(), bad)));
    assertEquals(List.of(new ValidationException.FieldViolation("query", "blank"),
        new ValidationException.FieldViolation("top_n", "negative")), e.violations());
  }

  @Test
  void aStatusWithoutDetailsStillMaps() {
    RagSidecarException e = ErrorDetails.toException(Status.UNAVAILABLE.withDescription("down").asRuntimeException());
    assertInstanceOf(UnavailableException.class, e);
    assertEquals("", e.reason());
    assertEquals("UNAVAILABLE: down", e.getMessage());
  }

  static final Request TWO = Request.builder().query("q").document("a", "A").document("b", "B").topN(1).build();

  static RerankResult result(int index, String id) {
    return RerankResult.newBuilder().setIndex(index).setId(id).setRelevanceScore(0.5f).build();
  }

  @Test
  void rerankResultsMustReferenceRequestDocumentsOnce() {
    assertThrows(ContractViolationException.class, () -> SidecarReranker.fromProto(TWO,
        RerankResponse.newBuilder().addResults(result(2, "c")).build()));
    assertThrows(ContractViolationException.class, () -> SidecarReranker.fromProto(TWO,
        RerankResponse.newBuilder().addResults(result(1, "b")).addResults(result(1, "b")).build()));
    assertThrows(ContractViolationException.class, () -> SidecarReranker.fromProto(TWO,
        RerankResponse.newBuilder().addResults(result(0, "b")).build()));
    ContractViolationException e = assertThrows(ContractViolationException.class, () -> SidecarReranker.fromProto(
        TWO, RerankResponse.newBuilder().addResults(result(-1, "x")).build()));
    assertEquals(ContractViolationException.REASON, e.reason());
  }

  @Test
  void topNIsAppliedAfterTheResponse() {
    List<Reranker.RankedDocument> kept = SidecarReranker.fromProto(TWO,
        RerankResponse.newBuilder().addResults(result(1, "b")).addResults(result(0, "a")).build());
    assertEquals(List.of("b"), kept.stream().map(Reranker.RankedDocument::id).toList());
  }
}
