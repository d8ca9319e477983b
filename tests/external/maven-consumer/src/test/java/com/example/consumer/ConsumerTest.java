package com.example.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Message;
import com.google.protobuf.util.JsonFormat;
import io.ragsidecar.client.Sidecar;
import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.jar.JarFile;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * One call through the client and through each adapter, from the artifacts of the Maven repository `make dist` builds,
 * against a real sidecar, on the protobuf-java line the POM pins ({@code -Dprotobuf.version}).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ConsumerTest {
  private static final String QUERY = "toast four slices of bread";
  private static final List<String> TEXTS = List.of(
      "The Kettle K1 holds 1.7 litres of water and brings it to the boil in three minutes.",
      "The Toaster T4 browns four slices of bread at once and has a bagel setting.");

  private Sidecar sidecar;
  private Consumer consumer;

  @BeforeAll
  void start() {
    sidecar = Sidecar.start(null, false);
    consumer = new Consumer(sidecar.clientBuilder().awaitReady(Duration.ofSeconds(60)).build());
  }

  @AfterAll
  void stop() {
    consumer.close();
    sidecar.close();
  }

  @Test
  void runsOnThePinnedProtobufLineWithAlignedUtil() throws IOException, URISyntaxException {
    String pinned = System.getProperty("ragsidecar.protobufVersion");
    assertEquals(pinned, bundleVersion(Message.class), "protobuf-java on the class path");
    assertEquals(pinned, bundleVersion(JsonFormat.class), "protobuf-java-util on the class path");
  }

  /** The OSGi Bundle-Version of the jar a class was loaded from (protobuf's jars carry no pom.properties). */
  private static String bundleVersion(Class<?> type) throws IOException, URISyntaxException {
    Path jar = Path.of(type.getProtectionDomain().getCodeSource().getLocation().toURI());
    try (JarFile file = new JarFile(jar.toFile())) {
      return file.getManifest().getMainAttributes().getValue("Bundle-Version");
    }
  }

  @Test
  void springAiRunsOnOneJacksonLine() {
    assertEquals(tools.jackson.databind.cfg.PackageVersion.VERSION.toString(),
        tools.jackson.core.json.PackageVersion.VERSION.toString(), "jackson-databind and jackson-core");
  }

  @Test
  void clientReranks() {
    assertEquals(List.of("d1", "d0"), consumer.rerank(QUERY, TEXTS));
  }

  @Test
  void langchain4jScoringModelScores() {
    List<Double> scores = consumer.score(QUERY, TEXTS);
    assertEquals(2, scores.size());
    assertTrue(scores.get(1) > scores.get(0), scores::toString);
  }

  @Test
  void springAiPostProcessorReranks() {
    assertEquals(List.of(TEXTS.get(1)), consumer.springRerankTop(QUERY, TEXTS));
  }

  @Test
  void springAiRetrieverSearches() {
    List<String> hits = consumer.springRetrieve("how long do refunds take?",
        "Refunds go back to the original payment method within 5 business days.");
    assertEquals(1, hits.size(), hits::toString);
    assertTrue(hits.get(0).contains("5 business days"), hits::toString);
  }

  @Test
  void langchain4jContentRetrieverSearches() {
    List<String> hits = consumer.retrieve("how long do refunds take?",
        "Refunds go back to the original payment method within 5 business days.");
    assertEquals(1, hits.size(), hits::toString);
    assertTrue(hits.get(0).contains("5 business days"), hits::toString);
  }
}
