package io.ragsidecar.client;

import static io.ragsidecar.client.ReadmeExamples.EXAMPLE;
import static io.ragsidecar.client.ReadmeExamples.unit;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.client.ReadmeExamples.Block;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every Java example of the client's README compiles as written (see {@link ReadmeExamples}). The two provider examples
 * implement the host's SPIs, which are not on this class path: they compile against stand-ins that declare what the
 * examples assume of them (the README says to adapt those accessors to the host's version), never packaged.
 */
class ReadmeExamplesTest {
  private static final String CLIENT = """
      import io.ragsidecar.client.CallKind;
      import io.ragsidecar.client.ChatBinding;
      import io.ragsidecar.client.ChatTurn;
      import io.ragsidecar.client.ConfigurationValidation;
      import io.ragsidecar.client.GroundedTurn;
      import io.ragsidecar.client.KnowledgeChunk;
      import io.ragsidecar.client.KnowledgeScope;
      import io.ragsidecar.client.RagSidecarClient;
      import io.ragsidecar.client.Reranker;
      import io.ragsidecar.client.RetrievalRequests;
      import io.ragsidecar.client.RetrievedContext;
      import io.ragsidecar.client.RetryPolicy;
      import io.ragsidecar.client.SearchResult;
      import io.ragsidecar.client.SidecarChat;
      import io.ragsidecar.client.SidecarRetrieval;
      import java.nio.file.Path;
      import java.time.Duration;
      import java.util.LinkedHashMap;
      import java.util.List;
      import java.util.Map;
      import java.util.concurrent.TimeUnit;""";

  /** What the README's sections define before each block, in the README's order. */
  private static final List<String> SCAFFOLDS = List.of(
      "class Connecting {\n  static RagSidecarClient connect(io.grpc.ClientInterceptor tracingInterceptor) {\n"
          + EXAMPLE + "\n    return client;\n  }\n}",
      "class Tracing {\n  static RagSidecarClient connect() {\n" + EXAMPLE + "\n    return traced;\n  }\n}",
      "class Reranking {\n  static void rerank(RagSidecarClient client) {\n" + EXAMPLE + "\n  }\n}",
      "class Retrieval {\n  static void retrieve(RagSidecarClient client, String sessionId,\n"
          + "      LinkedHashMap<String, Object> actionParams) {\n" + EXAMPLE + "\n  }\n}",
      "class Memory {\n  static void remember(RagSidecarClient client) {\n" + EXAMPLE + "\n  }\n}",
      "class Chat {\n  interface Provider {\n    void send(List<io.ragsidecar.v1.ChatMessage> conversation);\n  }\n\n"
          + "  static void ground(RagSidecarClient client, List<io.ragsidecar.v1.ChatMessage> storedConversation,\n"
          + "      String stateText, Provider provider) {\n" + EXAMPLE + "\n  }\n}",
      "import com.tnsai.intelligence.rag.RetrievedDocument;\n\n" + EXAMPLE,
      "import com.tnsai.rag.ActionMetadata;\nimport com.tnsai.rag.Role;\nimport io.ragsidecar.v1.EnforceRequest;\n"
          + "import io.ragsidecar.v1.RequireReadyRequest;\nimport host.Declarations;\n"
          + "import static host.Lookups.*;\n\n" + EXAMPLE);

  /** The host's SPI types, as far as the provider examples use them. */
  private static final Map<String, String> HOST_STAND_INS = Map.of(
      "com.tnsai.intelligence.rag.Reranker", """
          package com.tnsai.intelligence.rag;
          import java.util.List;
          public interface Reranker {
            boolean supports(String model);
            List<RetrievedDocument> rerank(Request request);
            interface Request {
              String query();
              String model();
              List<RetrievedDocument> documents();
            }
          }""",
      "com.tnsai.intelligence.rag.RetrievedDocument", """
          package com.tnsai.intelligence.rag;
          public interface RetrievedDocument {
            String id();
            String content();
          }""",
      "com.tnsai.rag.RetrievalSpi", """
          package com.tnsai.rag;
          import java.util.Map;
          public interface RetrievalSpi {
            String RESOLVED_SOURCE_PATHS_KEY = "resolvedSourcePaths";
            String RETRIEVED_CONTEXT_KEY = "retrievedContext";
            String RETRIEVED_DOCUMENT_COUNT_KEY = "retrievedDocumentCount";
            String RETRIEVED_STALE_FALLBACK_KEY = "retrievedStaleFallback";
            String RETRIEVED_CONTEXT_TRUNCATED_KEY = "retrievedContextTruncated";
            String KNOWLEDGE_SCOPE_KEY = "knowledgeScope";
            void enforce(ActionMetadata action, Role role, Map<String, Object> params, Map<String, Object> context);
            void enforce(ActionMetadata action, Object target, Map<String, Object> params, Map<String, Object> context);
            Map<String, Integer> requireReady(Object target, Map<String, Object> context);
          }""",
      "com.tnsai.rag.ActionMetadata", "package com.tnsai.rag;\npublic interface ActionMetadata {\n  String getName();\n}",
      "com.tnsai.rag.Role", "package com.tnsai.rag;\npublic interface Role {}",
      "host.Declarations", """
          package host;
          public final class Declarations {
            public static io.ragsidecar.v1.Target target(Class<?> type) {
              return io.ragsidecar.v1.Target.newBuilder().setName(type.getName()).build();
            }
          }""",
      "host.Lookups", """
          package host;
          public final class Lookups {
            public static String modelOf(Object target) { return "gpt-4o"; }
            public static String principalIdOf(Object scope) { return "agent-host"; }
            public static String tenantOf(Object scope) { return "acme"; }
            public static String sessionOf(Object scope) { return "s1"; }
          }""");

  private static final List<String> CLASS_NAMES = List.of("readme.Connecting", "readme.Tracing", "readme.Reranking",
      "readme.Retrieval", "readme.Memory", "readme.Chat", "readme.SidecarRerankerProvider", "readme.SidecarRetrievalProvider");

  @Test
  void everyJavaExampleCompiles(@TempDir Path out) {
    List<Block> blocks = ReadmeExamples.javaBlocks(ReadmeExamples.readme());
    assertEquals(SCAFFOLDS.size(), blocks.size(), "one scaffold per java block of the README, in its order");
    Map<String, String> units = new LinkedHashMap<>(HOST_STAND_INS);
    for (int i = 0; i < blocks.size(); i++) {
      units.put(CLASS_NAMES.get(i), unit(CLIENT, blocks.get(i), SCAFFOLDS.get(i)));
    }
    ReadmeExamples.compile(units, out);
  }

  /**
   * The repository README's example, as written on the test sidecar's port: it prints the context of its action, the
   * DIRECT persona whole and the SEARCH FAQ's passage.
   */
  @Test
  @ExtendWith(SidecarExtension.class)
  void theRepositoryReadmeExampleRuns(Sidecar sidecar, @TempDir Path out) throws ReflectiveOperationException {
    List<Block> blocks = ReadmeExamples.javaBlocks(Path.of("../../README.md").toAbsolutePath().normalize());
    assertEquals(1, blocks.size(), "the repository README's java blocks");
    String source = unit("", ReadmeExamples.onPort(blocks.get(0), sidecar.port()),
        "public final class RepositoryReadme {\n  public static void run() {\n" + EXAMPLE + "\n  }\n}");
    Method run = ReadmeExamples.compile(Map.of("readme.RepositoryReadme", source), out)
        .loadClass("readme.RepositoryReadme").getMethod("run");
    PrintStream stdout = System.out;
    ByteArrayOutputStream printed = new ByteArrayOutputStream();
    System.setOut(new PrintStream(printed, true, StandardCharsets.UTF_8));
    try {
      run.invoke(null);
    } finally {
      System.setOut(stdout);
    }
    String context = printed.toString(StandardCharsets.UTF_8);
    assertTrue(context.contains("You are Ada") && context.contains("within 30 days"), context);
  }

  @Test
  void theDependencySnippetNamesThisVersion() {
    ReadmeExamples.assertDependencyVersions(ReadmeExamples.readme(), System.getProperty("ragsidecar.version"));
  }
}
