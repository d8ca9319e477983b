package io.ragsidecar.client;

import io.ragsidecar.v1.PrepareChatKnowledgeResponse;
import java.util.List;

/**
 * What {@link SidecarRetrieval#prepareChatKnowledge} measured: the DIRECT blocks each grounded turn of the agent
 * gives.
 *
 * @param blocks the DIRECT blocks, in declaration order
 * @param inputWindowTokens the input window used, in tokens; 0 when no entry needed it
 * @param defaultBudgetTokens the shared default budget in tokens, derived from the input window; 0 when no entry
 *     draws on it
 * @param defaultBudgetUsedTokens tokens the blocks without {@code max_tokens} take together
 */
public record PreparedChatKnowledge(List<DirectBlock> blocks, int inputWindowTokens, int defaultBudgetTokens,
    int defaultBudgetUsedTokens) {

  public PreparedChatKnowledge {
    blocks = List.copyOf(blocks);
  }

  static PreparedChatKnowledge fromProto(PrepareChatKnowledgeResponse r) {
    return new PreparedChatKnowledge(r.getBlocksList().stream().map(DirectBlock::fromProto).toList(),
        r.getInputWindowTokens(), r.getDefaultBudgetTokens(), r.getDefaultBudgetUsedTokens());
  }
}
