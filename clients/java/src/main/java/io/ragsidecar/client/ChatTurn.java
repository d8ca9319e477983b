package io.ragsidecar.client;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.Objects;
import io.ragsidecar.v1.ActivityRecord;
import io.ragsidecar.v1.ChatMessage;
import io.ragsidecar.v1.ChatOwner;
import io.ragsidecar.v1.ChatRetrievalContext;
import io.ragsidecar.v1.GroundTurnRequest;
import io.ragsidecar.v1.Scope;
import io.ragsidecar.v1.Llm;

/**
 * One chat turn, the host bridge's {@code ChatTurn}: the conversation, owners, bindings, context, scope, activity and
 * model of a {@code GroundTurn}, immutable once built. Send it with {@link SidecarChat#groundTurn(ChatTurn)}.
 *
 * <pre>{@code
 * ChatTurn turn = ChatTurn.builder(storedConversation)
 *     .owners(ChatRequests.owner("narrator-7", stateText, logsEntry))
 *     .bindings(log)                                       // ChatBinding objects this process opened
 *     .context(ChatRequests.context().setRunId("run-9"))
 *     .llm(RetrievalRequests.llm("gpt-4o"))
 *     .build();
 * }</pre>
 *
 * <p>The GroundTurn rules (ids, owners listed once, each binding of a listed owner, scopes, the activity record,
 * the bindings against their owners' declarations, the resource caps) have one home: the sidecar. A turn that
 * breaks them is refused when it is sent, with the sidecar's {@link ValidationException} and its
 * {@linkplain ValidationException#violations() violations}, unchanged. The builder only refuses what would break
 * the client itself: {@code null} lists and elements.
 *
 * <p>Scopes left unset are completed by a {@linkplain SidecarChat#withScope scoped} facade; an unscoped one sends the
 * turn as it is. Immutable; build a new turn for each send.
 */
public final class ChatTurn {
  private final List<ChatMessage> conversation;
  private final List<ChatOwner> owners;
  private final List<ChatBinding> bindings;
  private final ChatRetrievalContext context;
  private final Scope scope;
  private final String requestSection;
  private final ActivityRecord activity;
  private final Llm llm;

  private ChatTurn(Builder b) {
    conversation = List.copyOf(b.conversation);
    owners = List.copyOf(b.owners);
    bindings = List.copyOf(b.bindings);
    context = b.context;
    scope = b.scope;
    requestSection = b.requestSection;
    activity = b.activity;
    llm = b.llm;
  }

  /** A turn over the stored conversation (oldest first), which neither the client nor the sidecar changes. */
  public static Builder builder(List<ChatMessage> conversation) {
    return new Builder(conversation);
  }

  /** The conversation, as given. */
  public List<ChatMessage> conversation() {
    return conversation;
  }

  /** The owners, in render order. */
  public List<ChatOwner> owners() {
    return owners;
  }

  /** The bindings the owners' searches go through. */
  public List<ChatBinding> bindings() {
    return bindings;
  }

  /** The request message (without principal), as {@link SidecarChat#groundTurn(ChatTurn)} sends it. */
  GroundTurnRequest.Builder request() {
    GroundTurnRequest.Builder b = GroundTurnRequest.newBuilder().addAllConversation(conversation).addAllOwners(owners)
        .setRequestSection(requestSection);
    bindings.forEach(binding -> b.addBindings(binding.turnBinding()));
    if (context != null) {
      b.setContext(context);
    }
    if (scope != null) {
      b.setScope(scope);
    }
    if (activity != null) {
      b.setActivity(activity);
    }
    if (llm != null) {
      b.setLlm(llm);
    }
    return b;
  }

  @Override
  public String toString() {
    return "ChatTurn[messages=" + conversation.size() + ", owners="
        + owners.stream().map(ChatOwner::getOwnerId).toList() + ", bindings=" + bindings
        + (context == null ? "" : ", with context") + "]";
  }

  /**
   * Builds a {@link ChatTurn}. Each setter replaces what an earlier call to it set; {@code null} owners, bindings and
   * messages are refused where they are given ({@link NullPointerException}).
   */
  public static final class Builder {
    private final List<ChatMessage> conversation;
    private List<ChatOwner> owners = List.of();
    private List<ChatBinding> bindings = List.of();
    private ChatRetrievalContext context;
    private Scope scope;
    private String requestSection = "";
    private ActivityRecord activity;
    private Llm llm;

    private Builder(List<ChatMessage> conversation) {
      this.conversation = nonNullElements(conversation, "conversation");
    }

    /** The owners whose state the turn carries, in render order. */
    public Builder owners(ChatOwner... owners) {
      return owners(Arrays.asList(owners));
    }

    /** The owners whose state the turn carries, in render order. */
    public Builder owners(Collection<ChatOwner> owners) {
      this.owners = nonNullElements(owners, "owners");
      return this;
    }

    /** The bindings the owners' searches go through, in any order. */
    public Builder bindings(ChatBinding... bindings) {
      return bindings(Arrays.asList(bindings));
    }

    /** The bindings the owners' searches go through, in any order. */
    public Builder bindings(Collection<ChatBinding> bindings) {
      this.bindings = nonNullElements(bindings, "bindings");
      return this;
    }

    /** The request-local retrieval context: with it, the owners' knowledge is given and searched. */
    public Builder context(ChatRetrievalContext context) {
      this.context = context;
      return this;
    }

    /** {@link #context(ChatRetrievalContext)} of this builder's message. */
    public Builder context(ChatRetrievalContext.Builder context) {
      return context(context == null ? null : context.build());
    }

    /**
     * The turn's tenant and session, which its bindings must belong to when it has no context (with one, it must
     * equal the context's scope). A {@linkplain SidecarChat#withScope scoped} facade sets it.
     */
    public Builder scope(Scope scope) {
      this.scope = scope;
      return this;
    }

    /** {@link #scope(Scope)} of this scope's tenant and session. */
    public Builder scope(KnowledgeScope scope) {
      return scope(scope == null ? null : scope.scope());
    }

    /** Added at the end of the last system message, before the owners' state; {@code null} or blank adds nothing. */
    public Builder requestSection(String requestSection) {
      this.requestSection = requestSection == null ? "" : requestSection;
      return this;
    }

    /** The agent's recent activity, rendered after the request section. */
    public Builder activity(ActivityRecord activity) {
      this.activity = activity;
      return this;
    }

    /** The model the turn goes to; its input window sizes the DIRECT budgets. */
    public Builder llm(Llm llm) {
      this.llm = llm;
      return this;
    }

    /** The turn; the sidecar checks it when it is sent. */
    public ChatTurn build() {
      return new ChatTurn(this);
    }

    private static <T> List<T> nonNullElements(Collection<T> items, String name) {
      Objects.requireNonNull(items, name);
      List<T> copy = new ArrayList<>(items.size());
      for (T item : items) {
        copy.add(Objects.requireNonNull(item, () -> "a null element in " + name));
      }
      return copy;
    }
  }
}
