package io.ragsidecar.client;

import io.ragsidecar.v1.DirectKnowledgeBlock;
import java.util.Objects;

/**
 * A DIRECT knowledge block a chat turn gives, measured against its budget.
 *
 * @param source the knowledge source's name
 * @param position index of the entry in the declared entries, so the block keeps its place around SEARCH evidence
 * @param text the rendered block; empty in {@link GroundedTurn.OwnerOutcome#directBlocks()}, whose text is already
 *     in the outbound conversation
 * @param tokens tokens the block takes, as the sidecar's token counter counts them
 * @param budgetTokens the budget the block was measured against: its {@code max_tokens}, or the shared default
 * @param sharedBudget whether the entry has no {@code max_tokens} and draws on the shared default budget
 * @param documentCount number of documents in the block
 */
public record DirectBlock(String source, int position, String text, int tokens, int budgetTokens,
    boolean sharedBudget, int documentCount) {

  public DirectBlock {
    Objects.requireNonNull(source, "source");
    Objects.requireNonNull(text, "text");
  }

  static DirectBlock fromProto(DirectKnowledgeBlock b) {
    return new DirectBlock(b.getSource(), b.getPosition(), b.getText(), b.getTokens(), b.getBudgetTokens(),
        b.getSharedBudget(), b.getDocumentCount());
  }
}
