package io.ragsidecar.client;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import io.ragsidecar.v1.ActivityRecord;
import io.ragsidecar.v1.ChatMessage;
import io.ragsidecar.v1.ChatOwner;
import io.ragsidecar.v1.ChatRetrievalContext;
import io.ragsidecar.v1.GroundTurnRequest;
import io.ragsidecar.v1.Scope;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.Llm;

/**
 * One chat turn, checked when it is built: the host bridge's {@code ChatTurn}. A malformed turn fails in
 * {@link Builder#build()} with the {@link ValidationException} the sidecar would answer (the same rules and field
 * names, every problem at once), before any call. Send it with {@link SidecarChat#groundTurn(ChatTurn)}.
 *
 * <pre>{@code
 * ChatTurn turn = ChatTurn.builder(storedConversation)
 *     .owners(ChatRequests.owner("narrator-7", stateText, logsEntry))
 *     .bindings(log)                                       // ChatBinding objects this process opened
 *     .context(ChatRequests.context().setRunId("run-9"))
 *     .llm(RetrievalRequests.llm("gpt-4o"))
 *     .build();                                            // ValidationException here, not when sent
 * }</pre>
 *
 * <p>{@code build()} checks what the sidecar checks before it looks anything up: owner and binding ids (present, at
 * most 256 characters, no control characters, unique), knowledge names unique per owner, each binding of a listed
 * owner, a context only with owners, the scopes the turn sets (a tenant; the turn's own scope equal to its
 * context's), {@code llm.input_window_tokens} and the activity record's kinds and caps. It also
 * checks each binding against its owner's declarations, as the sidecar does when it resolves them: at most one
 * declared binding per owner, over an enabled SEARCH entry of that owner with the entry's {@code top_k}; no two
 * bindings of one owner on one source; no undeclared binding on a name the owner declares. Whether each binding is
 * still open, and in the turn's tenant and session, only the sidecar knows.
 *
 * <p>Scopes left unset are completed by a {@linkplain SidecarChat#withScope scoped} facade; an unscoped one sends the
 * turn as it is (the sidecar then refuses a context without a tenant, or a turn with bindings and no scope). The
 * sidecar's resource caps (messages, owners, bindings, characters of a text, activity entries), the knowledge entries'
 * own fields and the messages' extras are checked when the turn is sent. Immutable; build a new turn for each send.
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

    /**
     * The turn, once its shape and its bindings' declarations hold.
     *
     * @throws ValidationException naming every problem, reason {@code INVALID_REQUEST}, as the sidecar would
     */
    public ChatTurn build() {
      ChatTurn turn = new ChatTurn(this);
      TurnChecks.check(turn);
      return turn;
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

  /**
   * The sidecar's GroundTurn rules ({@code api/chat_service.py} and {@code chat/grounding.py}), in its order and
   * with its field names and descriptions. Its resource caps (messages, owners, bindings, characters of a text,
   * activity entries and redaction roots) are the sidecar's policy and stay with it: a turn over one is refused
   * when it is sent.
   */
  static final class TurnChecks {
    private static final int MAX_ID_CHARS = 256;
    private static final int MAX_ROOT_CHARS = 4096;

    private final List<ValidationException.FieldViolation> problems = new ArrayList<>();

    private TurnChecks() {}

    static void check(ChatTurn turn) {
      TurnChecks shape = new TurnChecks();
      if (turn.llm != null && turn.llm.hasInputWindowTokens() && turn.llm.getInputWindowTokens() < 1) {
        shape.add("llm.input_window_tokens", "must be at least 1 when set");
      }
      shape.shape(turn);
      shape.raise();
      TurnChecks declarations = new TurnChecks();
      declarations.declarations(turn.owners, turn.bindings);
      declarations.raise();
    }

    private void shape(ChatTurn turn) {
      Map<String, Integer> listed = new HashMap<>();
      for (int i = 0; i < turn.owners.size(); i++) {
        String id = turn.owners.get(i).getOwnerId();
        if (!id(id, "owners[" + i + "].owner_id", true) && listed.containsKey(id)) {
          add("owners[" + i + "].owner_id", "owner '" + id + "' is listed twice (also owners[" + listed.get(id) + "])");
        }
        listed.putIfAbsent(id, i);
        uniqueKnowledge(turn.owners.get(i), "owners[" + i + "]");
      }
      Set<String> ids = new HashSet<>();
      for (int j = 0; j < turn.bindings.size(); j++) {
        ChatBinding binding = turn.bindings.get(j);
        if (!id(binding.id(), "bindings[" + j + "].binding_id", true) && ids.contains(binding.id())) {
          add("bindings[" + j + "].binding_id", "the binding is listed twice");
        }
        ids.add(binding.id());
        if (!listed.containsKey(binding.ownerId())) {
          add("bindings[" + j + "].owner_id", "'" + binding.ownerId() + "' is not a listed owner");
        }
      }
      scopes(turn);
      if (turn.activity != null) {
        activity(turn.activity);
      }
    }

    /**
     * The context's and the turn's scopes, where the turn sets them; a scope left unset is the facade's to fill
     * ({@link SidecarChat#withScope}), so a turn without one is not refused here.
     */
    private void scopes(ChatTurn turn) {
      if (turn.context != null) {
        if (turn.owners.isEmpty()) {
          add("context", "a retrieval context needs at least one owner");
        }
        if (turn.context.hasScope()) {
          scope(turn.context.getScope(), "context.scope");
          if (turn.scope != null && !turn.scope.equals(turn.context.getScope())) {
            add("scope", "differs from context.scope");
          }
        }
      } else if (turn.scope != null) {
        scope(turn.scope, "scope");
      }
    }

    private void scope(Scope scope, String at) {
      id(scope.getTenant(), at + ".tenant", true);
      id(scope.getSession(), at + ".session", false);
    }

    /** The sidecar's caller-id rules ({@code identifiers.id_problems}); whether the id broke one. */
    private boolean id(String value, String field, boolean required) {
      if (isBlank(value)) {
        if (required) {
          add(field, "required");
        }
        return required;
      }
      int chars = value.codePointCount(0, value.length());
      if (chars > MAX_ID_CHARS) {
        add(field, "longer than " + MAX_ID_CHARS + " characters (" + chars + ")");
        return true;
      }
      if (value.codePoints().anyMatch(c -> Character.getType(c) == Character.CONTROL)) {
        add(field, "contains control characters");
        return true;
      }
      return false;
    }

    /** Blank as Python's {@code str.strip()} sees it: nothing but the characters {@code str.isspace()} accepts. */
    static boolean isBlank(String value) {
      return value.codePoints().allMatch(c -> (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85
          || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f
          || c == 0x205f || c == 0x3000);
    }

    private void uniqueKnowledge(ChatOwner owner, String at) {
      Set<String> seen = new HashSet<>();
      List<KnowledgeEntry> knowledge = owner.getKnowledgeList();
      for (int k = 0; k < knowledge.size(); k++) {
        String name = knowledge.get(k).getName();
        if (!seen.add(name)) {
          add(at + ".knowledge[" + k + "].name", "knowledge '" + name + "' is declared twice");
        }
      }
    }

    private void activity(ActivityRecord record) {
      for (int i = 0; i < record.getEntriesCount(); i++) {
        switch (record.getEntries(i).getKind()) {
          case ACTIVITY_KIND_SENT, ACTIVITY_KIND_RECEIVED, ACTIVITY_KIND_ACTED, ACTIVITY_KIND_NOTED -> { }
          default -> add("activity.entries[" + i + "].kind", "an activity kind is required");
        }
      }
      long maxEntries = record.hasMaxEntries() ? Integer.toUnsignedLong(record.getMaxEntries()) : 40;
      long maxTotal = record.hasMaxTotalChars() ? Integer.toUnsignedLong(record.getMaxTotalChars()) : 8000;
      long maxEntry = record.hasMaxEntryChars() ? Integer.toUnsignedLong(record.getMaxEntryChars()) : 400;
      atLeastOne("activity.max_entries", maxEntries);
      atLeastOne("activity.max_total_chars", maxTotal);
      atLeastOne("activity.max_entry_chars", maxEntry);
      if (maxEntry > maxTotal) {
        add("activity.max_entry_chars", maxEntry + " exceeds max_total_chars (" + maxTotal + ")");
      }
      for (int i = 0; i < record.getRedactionRootsCount(); i++) {
        String path = record.getRedactionRoots(i).getPath();
        if (isBlank(path) || path.codePointCount(0, path.length()) > MAX_ROOT_CHARS || path.indexOf('\0') >= 0) {
          add("activity.redaction_roots[" + i + "].path", "required, at most " + MAX_ROOT_CHARS
              + " characters and no NUL");
        }
      }
    }

    private void atLeastOne(String field, long value) {
      if (value < 1) {
        add(field, "must be at least 1 when set");
      }
    }

    private void declarations(List<ChatOwner> owners, List<ChatBinding> bindings) {
      Map<String, Map<String, KnowledgeEntry>> declaredBy = new HashMap<>();
      for (ChatOwner owner : owners) {
        Map<String, KnowledgeEntry> entries = new HashMap<>();
        owner.getKnowledgeList().forEach(e -> entries.put(e.getName(), e));
        declaredBy.put(owner.getOwnerId(), entries);
      }
      Map<String, Integer> firstDeclared = new HashMap<>();
      Map<List<String>, Integer> sources = new HashMap<>();
      for (int j = 0; j < bindings.size(); j++) {
        ChatBinding binding = bindings.get(j);
        String at = "bindings[" + j + "]";
        String owner = binding.ownerId();
        Map<String, KnowledgeEntry> declared = declaredBy.get(owner);
        Integer same = sources.putIfAbsent(List.of(owner, binding.source()), j);
        if (same != null) {
          add(at, "owner '" + owner + "' already searches '" + binding.source() + "' through bindings[" + same + "]");
        }
        if (!binding.declared()) {
          if (declared.containsKey(binding.source())) {
            add(at, "an undeclared binding may not use '" + binding.source() + "', knowledge that owner '" + owner
                + "' declares");
          }
          continue;
        }
        Integer first = firstDeclared.putIfAbsent(owner, j);
        if (first != null) {
          add(at, "owner '" + owner + "' already has a declared binding (bindings[" + first + "])");
        }
        declaredEntry(at, binding, declared.get(binding.source()));
      }
    }

    private void declaredEntry(String at, ChatBinding binding, KnowledgeEntry entry) {
      boolean enabled = entry != null && (!entry.hasEnabled() || entry.getEnabled());
      if (!enabled || entry.getUse() != io.ragsidecar.v1.KnowledgeUse.KNOWLEDGE_USE_SEARCH) {
        add(at, "declared binding source '" + binding.source() + "' is not an enabled SEARCH entry of owner '"
            + binding.ownerId() + "'");
        return;
      }
      int k = entry.getTopK() != 0 ? entry.getTopK() : SidecarChat.DEFAULT_TOP_K;
      if (k != binding.topK()) {
        add(at, "declared binding top_k " + binding.topK() + " differs from '" + binding.source() + "''s top_k " + k);
      }
    }

    private void add(String field, String description) {
      problems.add(new ValidationException.FieldViolation(field, description));
    }

    private void raise() {
      if (!problems.isEmpty()) {
        throw ValidationException.local(problems);
      }
    }
  }
}
