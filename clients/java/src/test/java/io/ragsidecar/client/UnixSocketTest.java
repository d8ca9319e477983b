package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.client.SidecarExtension.Options;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** The client reaches a sidecar over its Unix domain socket. */
@ExtendWith(SidecarExtension.class)
class UnixSocketTest {

  @Test
  void rerankOverAUnixSocket(@Options(unixSocket = true) Sidecar sidecar) throws Exception {
    try (RagSidecarClient client = RagSidecarClient.builder().unixSocket(sidecar.unixSocket()).build()) {
      assertEquals("unix:" + sidecar.unixSocket(), client.target());
      client.reranker().awaitModels(Duration.ofSeconds(30));
      assertTrue(client.reranker().supports(RerankerTest.BI_ENCODER));
      assertEquals("paris", client.reranker().rerank(RerankerTest.france()).get(0).id());
      assertEquals("paris", client.reranker().rerankAsync(RerankerTest.france().toBuilder()
          .model(RerankerTest.BI_ENCODER).build()).get(30, TimeUnit.SECONDS).get(0).id());
      assertThrows(UnknownModelException.class, () -> client.reranker().rerank(RerankerTest.france().toBuilder()
          .model("nope").build()));
    }
  }
}
