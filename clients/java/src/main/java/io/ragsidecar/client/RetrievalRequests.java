package io.ragsidecar.client;

import com.google.protobuf.ListValue;
import com.google.protobuf.NullValue;
import com.google.protobuf.Struct;
import com.google.protobuf.Value;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import io.ragsidecar.v1.Action;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.KnowledgeType;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.Llm;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.Param;
import io.ragsidecar.v1.RerankOrder;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.Target;

/**
 * Small helpers for the {@code RetrievalService} messages a host builds most: knowledge entries, actions, targets,
 * models and action parameters. They return the generated messages (or their builders, for the optional fields), so
 * anything they do not cover is one {@code set...} call away.
 *
 * <pre>{@code
 * Target role = RetrievalRequests.target("com.acme.SupportRole",
 *     List.of(RetrievalRequests.file("persona", KnowledgeUse.KNOWLEDGE_USE_DIRECT, "persona.md").build(),
 *             RetrievalRequests.file("products", KnowledgeUse.KNOWLEDGE_USE_SEARCH, "products.jsonl")
 *                 .setTopK(3).build()),
 *     RetrievalRequests.action("answer", "persona", "products"));
 * }</pre>
 */
public final class RetrievalRequests {
  private RetrievalRequests() {}

  /** A knowledge entry of any type; set the optional fields on the returned builder. */
  public static KnowledgeEntry.Builder entry(String name, KnowledgeType type, KnowledgeUse use) {
    return KnowledgeEntry.newBuilder().setName(Objects.requireNonNull(name, "name")).setType(type).setUse(use);
  }

  /** A FILE entry; an empty path means the host locates it per call through {@code resolved_paths}. */
  public static KnowledgeEntry.Builder file(String name, KnowledgeUse use, String path) {
    return entry(name, KnowledgeType.KNOWLEDGE_TYPE_FILE, use).setPath(path == null ? "" : path);
  }

  /** A DIRECTORY entry: every supported file under a folder (recursively) or matching a glob. */
  public static KnowledgeEntry.Builder directory(String name, KnowledgeUse use, String pathOrGlob) {
    return entry(name, KnowledgeType.KNOWLEDGE_TYPE_DIRECTORY, use).setPath(pathOrGlob == null ? "" : pathOrGlob);
  }

  /** A MEMORY entry: documents written with {@link SidecarRetrieval#upsertDocuments}, per (tenant, session). */
  public static KnowledgeEntry.Builder memory(String name, KnowledgeUse use) {
    return entry(name, KnowledgeType.KNOWLEDGE_TYPE_MEMORY, use);
  }

  /** An INLINE entry: this text, one document. */
  public static KnowledgeEntry.Builder inline(String name, KnowledgeUse use, String text) {
    return entry(name, KnowledgeType.KNOWLEDGE_TYPE_INLINE, use).setInlineText(text);
  }

  /**
   * Search options that rerank a SEARCH entry's candidates with this model ({@code null} or empty: the configured
   * default reranker), its hits in this order: {@code RERANK_ORDER_FUSED} (the default, measured best) combines
   * the reranker's relevance with the retrieval order, so a hit in the reranker's top k can be pushed out, and a
   * hit's {@code score} is the combined one; {@code RERANK_ORDER_RERANKER} keeps the reranker's own relevance
   * order cut to top k, as the host's Reranker SPI gives it, and the score is that relevance. Either way the relevance is in
   * {@code scores.rerank}. Set it with {@code KnowledgeEntry.Builder.setSearch} or {@code SearchRequest.Builder
   * .setSearch}.
   */
  public static SearchOptions rerank(String model, RerankOrder order) {
    return SearchOptions.newBuilder().setRerank(true).setRerankerModel(model == null ? "" : model)
        .setRerankOrder(Objects.requireNonNull(order, "order")).build();
  }

  /** An action naming its knowledge, in declaration order. */
  public static Action action(String name, String... knowledge) {
    return Action.newBuilder().setName(name).addAllKnowledge(Arrays.asList(knowledge)).build();
  }

  /** A target (the Role or object class, fully qualified) with its own knowledge and actions. */
  public static Target target(String name, List<KnowledgeEntry> knowledge, Action... actions) {
    return Target.newBuilder().setName(name).addAllKnowledge(knowledge).addAllActions(Arrays.asList(actions)).build();
  }

  /** A model whose input window the sidecar looks up in its table. */
  public static Llm llm(String model) {
    return Llm.newBuilder().setModel(model).build();
  }

  /** A model with an explicit input window, in tokens. */
  public static Llm llm(String model, int inputWindowTokens) {
    return Llm.newBuilder().setModel(model).setInputWindowTokens(inputWindowTokens).build();
  }

  /** A MEMORY document. */
  public static MemoryDocument document(String id, String text) {
    return MemoryDocument.newBuilder().setId(id).setText(text).build();
  }

  /** A MEMORY document with metadata. */
  public static MemoryDocument document(String id, String text, Map<String, String> metadata) {
    return MemoryDocument.newBuilder().setId(id).setText(text).putAllMetadata(metadata).build();
  }

  /**
   * An action's working parameters, in the map's iteration order (use a {@link java.util.LinkedHashMap} in
   * declaration order: the first string parameter is the default query).
   *
   * <p>Values convert as JSON does: {@link CharSequence} to a string, {@link Number} to a number, {@link Boolean},
   * {@code null}, {@link Map} (string keys) to a struct, {@link Iterable} and arrays to a list.
   * Any other object (an enum included) is sent as {@code null_value}: the sidecar only ever reads string values
   * (as queries), and a host's domain object must not become one through {@code toString()}.
   */
  public static List<Param> params(Map<String, ?> params) {
    List<Param> out = new ArrayList<>(params.size());
    params.forEach((name, value) -> out.add(param(name, value)));
    return out;
  }

  /** One action parameter; see {@link #params(Map)} for how the value converts. */
  public static Param param(String name, Object value) {
    return Param.newBuilder().setName(Objects.requireNonNull(name, "name")).setValue(value(value)).build();
  }

  static Value value(Object value) {
    if (value == null) {
      return Value.newBuilder().setNullValue(NullValue.NULL_VALUE).build();
    }
    if (value instanceof Value v) {
      return v;
    }
    if (value instanceof CharSequence s) {
      return Value.newBuilder().setStringValue(s.toString()).build();
    }
    if (value instanceof Number n) {
      return Value.newBuilder().setNumberValue(n.doubleValue()).build();
    }
    if (value instanceof Boolean b) {
      return Value.newBuilder().setBoolValue(b).build();
    }
    if (value instanceof Map<?, ?> map) {
      Struct.Builder struct = Struct.newBuilder();
      for (Map.Entry<?, ?> e : map.entrySet()) {
        struct.putFields(String.valueOf(e.getKey()), value(e.getValue()));
      }
      return Value.newBuilder().setStructValue(struct).build();
    }
    if (value instanceof Iterable<?> items) {
      ListValue.Builder list = ListValue.newBuilder();
      items.forEach(item -> list.addValues(value(item)));
      return Value.newBuilder().setListValue(list).build();
    }
    if (value instanceof Object[] items) {
      return value(Arrays.asList(items));
    }
    return Value.newBuilder().setNullValue(NullValue.NULL_VALUE).build();
  }
}
