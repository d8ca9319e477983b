package io.ragsidecar.client;

import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import io.ragsidecar.v1.ChatMessage;
import io.ragsidecar.v1.ChatOwner;
import io.ragsidecar.v1.ChatRetrievalContext;
import io.ragsidecar.v1.KnowledgeEntry;

/**
 * Small helpers for the {@code ChatKnowledgeService} messages a host builds most: chat messages, owners and the
 * retrieval context. Knowledge entries and models come from {@link RetrievalRequests}; a binding's
 * {@code TurnBinding} from {@link ChatBinding#turnBinding()}.
 */
public final class ChatRequests {
  private ChatRequests() {}

  /** A chat message; a {@code null} content is JSON null (an assistant message that only calls tools). */
  public static ChatMessage message(String role, String content) {
    ChatMessage.Builder b = ChatMessage.newBuilder().setRole(Objects.requireNonNull(role, "role"));
    if (content != null) {
      b.setContent(content);
    }
    return b.build();
  }

  /** A {@code system} message. */
  public static ChatMessage system(String content) {
    return message("system", content);
  }

  /** A {@code user} message. */
  public static ChatMessage user(String content) {
    return message("user", content);
  }

  /** An {@code assistant} message. */
  public static ChatMessage assistant(String content) {
    return message("assistant", content);
  }

  /** A {@code tool} message answering the tool call {@code toolCallId}. */
  public static ChatMessage tool(String toolCallId, String content) {
    return message("tool", content).toBuilder().setToolCallId(toolCallId).build();
  }

  /** An owner of a turn: its stable id, its rendered state (empty adds nothing) and its chat knowledge. */
  public static ChatOwner owner(String ownerId, String stateText, KnowledgeEntry... knowledge) {
    return owner(ownerId, stateText, Arrays.asList(knowledge));
  }

  /** An owner of a turn, its knowledge in declaration order. */
  public static ChatOwner owner(String ownerId, String stateText, List<KnowledgeEntry> knowledge) {
    return ChatOwner.newBuilder().setOwnerId(Objects.requireNonNull(ownerId, "ownerId"))
        .setStateText(stateText == null ? "" : stateText).addAllKnowledge(knowledge).build();
  }

  /**
   * An empty retrieval context, to set run id, agent name, episode, ... on; a facade
   * {@linkplain SidecarChat#withScope scoped} to a {@link KnowledgeScope} sets its scope.
   */
  public static ChatRetrievalContext.Builder context() {
    return ChatRetrievalContext.newBuilder();
  }

  /** A retrieval context in this scope's tenant and session. */
  public static ChatRetrievalContext.Builder context(KnowledgeScope scope) {
    return ChatRetrievalContext.newBuilder().setScope(scope.scope());
  }
}
