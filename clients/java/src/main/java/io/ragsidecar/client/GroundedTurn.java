package io.ragsidecar.client;

import java.util.List;
import java.util.Objects;
import java.util.Optional;
import io.ragsidecar.v1.ChatMessage;
import io.ragsidecar.v1.GroundTurnResponse;
import io.ragsidecar.v1.Timing;
import io.ragsidecar.v1.Usage;

/**
 * What {@link SidecarChat#groundTurn} gives a chat turn: the outbound conversation to send to the model as is, and
 * what the sidecar did for the turn as a whole and for each owner.
 *
 * <p>The outbound conversation is a new list: the request's conversation is never changed. It carries this turn's
 * request section, owners' state and fenced knowledge only (earlier sidecar-marked regions are stripped), so a host
 * may store either the conversation it sent or this one: the next turn strips them again.
 *
 * @param conversation the outbound conversation, oldest first
 * @param grounding whether the turn was grounded, as a whole
 * @param detail human-readable detail for {@link Grounding#RENDER_FAILED}; empty otherwise
 * @param owners one outcome per owner, in the request's owner order
 * @param staleFallbacks sources served from their last good index; empty when none
 * @param usage embedding and rerank work spent
 * @param timing server-side timings
 */
public record GroundedTurn(
    List<ChatMessage> conversation,
    Grounding grounding,
    String detail,
    List<OwnerOutcome> owners,
    List<RetrievedContext.StaleFallback> staleFallbacks,
    Usage usage,
    Timing timing) {

  /** Opening tag of the fence every piece of knowledge is written in. */
  public static final String FENCE_OPEN = "<tnsai-memory>";
  /** Closing tag of the fence. */
  public static final String FENCE_CLOSE = "</tnsai-memory>";

  public GroundedTurn {
    conversation = List.copyOf(conversation);
    Objects.requireNonNull(grounding, "grounding");
    detail = detail == null ? "" : detail;
    owners = List.copyOf(owners);
    staleFallbacks = List.copyOf(staleFallbacks);
  }

  static GroundedTurn fromProto(GroundTurnResponse r) {
    return new GroundedTurn(r.getConversationList(),
        named(Grounding.class, r.getGrounding(), "TURN_GROUNDING_", Grounding.UNKNOWN, Grounding.UNKNOWN),
        r.getDetail(),
        r.getOwnersList().stream().map(OwnerOutcome::fromProto).toList(),
        r.getStaleFallbacksList().stream().map(RetrievedContext.StaleFallback::fromProto).toList(),
        r.getUsage(), r.getTiming());
  }

  /** Whether knowledge was given: at least one DIRECT block or one piece of evidence is in the fence. */
  public boolean isGrounded() {
    return grounding == Grounding.GROUNDED;
  }

  /** The outcome of this owner; empty when the turn did not list it. */
  public Optional<OwnerOutcome> owner(String ownerId) {
    return owners.stream().filter(o -> o.ownerId().equals(ownerId)).findFirst();
  }

  /** Pieces of SEARCH evidence given, over all owners. */
  public int documentCount() {
    return owners.stream().mapToInt(OwnerOutcome::documentCount).sum();
  }

  /**
   * The content of the outbound conversation's last system message, where the sidecar writes the request section,
   * the owners' state and the fenced knowledge; empty when there is none (a turn with nothing to add and no system
   * message of its own).
   */
  public Optional<String> systemText() {
    for (int i = conversation.size() - 1; i >= 0; i--) {
      ChatMessage m = conversation.get(i);
      if ("system".equals(m.getRole())) {
        return Optional.of(m.getContent());
      }
    }
    return Optional.empty();
  }

  /**
   * The text inside the {@value #FENCE_OPEN} fence of the last system message (DIRECT blocks and evidence, every
   * angle bracket escaped); empty when no knowledge was given.
   */
  public String knowledge() {
    String text = systemText().orElse("");
    int open = text.indexOf(FENCE_OPEN);
    int close = text.lastIndexOf(FENCE_CLOSE);
    return open < 0 || close < open ? "" : text.substring(open + FENCE_OPEN.length(), close);
  }

  /**
   * What a turn did for one owner.
   *
   * @param ownerId the owner's id
   * @param search what happened to its SEARCH knowledge
   * @param documentCount pieces of evidence given for it; 0 unless {@code search} is {@link OwnerSearch#GROUNDED}
   * @param failOpenReason why it failed open; {@link FailOpenReason#NONE} unless it did
   * @param detail human-readable detail of a failure (not a stable string); empty otherwise
   * @param searchedSources the binding sources searched, in the order searched
   * @param directBlocks the DIRECT blocks given, in declaration order (their text is in the conversation, not here)
   */
  public record OwnerOutcome(
      String ownerId,
      OwnerSearch search,
      int documentCount,
      FailOpenReason failOpenReason,
      String detail,
      List<String> searchedSources,
      List<DirectBlock> directBlocks) {

    public OwnerOutcome {
      Objects.requireNonNull(ownerId, "ownerId");
      Objects.requireNonNull(search, "search");
      Objects.requireNonNull(failOpenReason, "failOpenReason");
      detail = detail == null ? "" : detail;
      searchedSources = List.copyOf(searchedSources);
      directBlocks = List.copyOf(directBlocks);
    }

    static OwnerOutcome fromProto(io.ragsidecar.v1.OwnerOutcome o) {
      return new OwnerOutcome(o.getOwnerId(),
          named(OwnerSearch.class, o.getSearch(), "OWNER_SEARCH_", OwnerSearch.UNKNOWN, OwnerSearch.UNKNOWN),
          o.getDocumentCount(),
          named(FailOpenReason.class, o.getFailOpenReason(), "FAIL_OPEN_REASON_", FailOpenReason.NONE,
              FailOpenReason.UNKNOWN),
          o.getDetail(), o.getSearchedSourcesList(),
          o.getDirectBlocksList().stream().map(DirectBlock::fromProto).toList());
    }

    /** Whether its SEARCH evidence was given. */
    public boolean isGrounded() {
      return search == OwnerSearch.GROUNDED;
    }

    /** Whether it was searched but failed open ({@link #failOpenReason()} says why). */
    public boolean failedOpen() {
      return search == OwnerSearch.FAILED_OPEN;
    }
  }

  /** Whether a turn was grounded, as a whole. */
  public enum Grounding {
    /** Knowledge was given: at least one DIRECT block or one piece of evidence is in the fence. */
    GROUNDED,
    /** The turn has no owners: no state and no knowledge. */
    NO_OWNERS,
    /** The turn has no retrieval context: state only, no knowledge read. */
    NO_CONTEXT,
    /** The latest user message is missing or blank: dispatched ungrounded (state only). */
    NO_USER_MESSAGE,
    /** Rendering failed: dispatched ungrounded (state only); {@link GroundedTurn#detail()} says why. */
    RENDER_FAILED,
    /** The turn was eligible but nothing was given (every owner failed open or had nothing to give). */
    NOTHING_GIVEN,
    /** A value this client version does not know. */
    UNKNOWN
  }

  /** What happened to one owner's SEARCH knowledge. */
  public enum OwnerSearch {
    /** Searched; {@link OwnerOutcome#documentCount()} pieces of evidence were given. */
    GROUNDED,
    /** Searched, but failed open: {@link OwnerOutcome#failOpenReason()} says why; none of its evidence was given. */
    FAILED_OPEN,
    /** The owner declares SEARCH knowledge, but the turn has no binding for it: not searched. */
    NO_BINDING,
    /** The owner has no SEARCH knowledge and no binding: nothing to search. */
    NO_SEARCH_KNOWLEDGE,
    /** Not searched because the turn reads no knowledge (no context, no user message, or rendering failed). */
    NOT_ATTEMPTED,
    /** A value this client version does not know. */
    UNKNOWN
  }

  /** Why an owner failed open. */
  public enum FailOpenReason {
    /** It did not fail open. */
    NONE,
    /** A recoverable retrieval failure (a binding's search failed). */
    RETRIEVAL_FAILED,
    /** The searches returned nothing. */
    EMPTY_RESULT,
    /** The evidence did not fit the room left in the input window. */
    EVIDENCE_OVERSIZED,
    /** The context's deadline was spent before or during this owner's searches. */
    DEADLINE_EXCEEDED,
    /** A value this client version does not know. */
    UNKNOWN
  }

  /**
   * The constant of {@code type} named like {@code value} without its {@code prefix}: {@code unspecified} for the
   * proto's {@code _UNSPECIFIED}, {@code unknown} for a value newer than this client.
   */
  static <E extends Enum<E>> E named(Class<E> type, Enum<?> value, String prefix, E unspecified, E unknown) {
    String name = value.name();
    if (name.equals(prefix + "UNSPECIFIED")) {
      return unspecified;
    }
    for (E constant : type.getEnumConstants()) {
      if (name.equals(prefix + constant.name())) {
        return constant;
      }
    }
    return unknown;
  }
}
