package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.ragsidecar.client.SidecarExtension.Options;
import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** A sidecar started with RAGSIDECAR_TOKEN requires the bearer token on every call. */
@ExtendWith(SidecarExtension.class)
class AuthTest {
  static final String TOKEN = "s3cret-token-for-tests";

  @Test
  void theRightTokenIsAccepted(@Options(token = TOKEN) Sidecar sidecar) {
    try (RagSidecarClient client = sidecar.clientBuilder().bearerToken(TOKEN).build()) {
      client.reranker().awaitModels(Duration.ofSeconds(30));
      assertTrue(client.reranker().supports(RerankerTest.CROSS_ENCODER));
      assertEquals("paris", client.reranker().rerank(RerankerTest.france()).get(0).id());
    }
  }

  @Test
  void aWrongTokenIsRejected(@Options(token = TOKEN) Sidecar sidecar) throws Exception {
    try (RagSidecarClient client = sidecar.clientBuilder().bearerToken("wrong").build()) {
      UnauthenticatedException e = assertThrows(UnauthenticatedException.class,
          () -> client.reranker().rerank(RerankerTest.france()));
      assertEquals(Status.Code.UNAUTHENTICATED, e.code());
      assertEquals("UNAUTHENTICATED", e.reason());
      assertEquals(RagSidecarException.DOMAIN, e.domain());
      assertInstanceOf(StatusRuntimeException.class, e.getCause());

      ExecutionException async = assertThrows(ExecutionException.class,
          () -> client.reranker().rerankAsync(RerankerTest.france()).get(30, TimeUnit.SECONDS));
      assertInstanceOf(UnauthenticatedException.class, async.getCause());

      // No snapshot can be fetched, so nothing is supported.
      assertThrows(UnauthenticatedException.class, () -> client.reranker().refreshModels());
      assertFalse(client.reranker().supports(RerankerTest.CROSS_ENCODER));
    }
  }

  @Test
  void aMissingTokenIsRejected(@Options(token = TOKEN) Sidecar sidecar) {
    try (RagSidecarClient client = sidecar.clientBuilder().build()) {
      UnauthenticatedException e = assertThrows(UnauthenticatedException.class,
          () -> client.reranker().rerank(RerankerTest.france()));
      assertEquals("UNAUTHENTICATED", e.reason());
    }
  }
}
