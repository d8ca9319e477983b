package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;
import io.ragsidecar.v1.ChatMessage;
import io.ragsidecar.v1.FailOpenReason;
import io.ragsidecar.v1.GroundTurnResponse;
import io.ragsidecar.v1.OwnerOutcome;
import io.ragsidecar.v1.OwnerSearch;
import io.ragsidecar.v1.TurnGrounding;

/** {@link GroundedTurn} and {@link ChatRequests} without a sidecar. */
class ChatMappingTest {

  @Test
  void aResponseMapsToATypedTurn() {
    GroundTurnResponse response = GroundTurnResponse.newBuilder()
        .addConversation(ChatRequests.system("Be kind.\n\n<!-- ragsidecar:knowledge -->\n<tnsai-memory>\nE1\n"
            + "</tnsai-memory>\n<!-- /ragsidecar:knowledge -->"))
        .addConversation(ChatRequests.user("Hi"))
        .setGrounding(TurnGrounding.TURN_GROUNDING_GROUNDED)
        .addOwners(OwnerOutcome.newBuilder().setOwnerId("ada").setSearch(OwnerSearch.OWNER_SEARCH_GROUNDED)
            .setDocumentCount(2).addSearchedSources("orders"))
        .addOwners(OwnerOutcome.newBuilder().setOwnerId("bob").setSearch(OwnerSearch.OWNER_SEARCH_FAILED_OPEN)
            .setFailOpenReason(FailOpenReason.FAIL_OPEN_REASON_EMPTY_RESULT))
        .build();
    GroundedTurn turn = GroundedTurn.fromProto(response);
    assertTrue(turn.isGrounded());
    assertEquals("\nE1\n", turn.knowledge());
    assertEquals(2, turn.documentCount());
    assertTrue(turn.owner("ada").orElseThrow().isGrounded());
    assertTrue(turn.owner("bob").orElseThrow().failedOpen());
    assertEquals(GroundedTurn.Grounding.GROUNDED, turn.grounding());
    assertEquals(GroundedTurn.OwnerSearch.FAILED_OPEN, turn.owner("bob").orElseThrow().search());
    assertEquals(GroundedTurn.FailOpenReason.EMPTY_RESULT, turn.owner("bob").orElseThrow().failOpenReason());
    assertEquals(GroundedTurn.FailOpenReason.NONE, turn.owner("ada").orElseThrow().failOpenReason());
    assertFalse(turn.owner("carol").isPresent());
    assertEquals(List.of("orders"), turn.owner("ada").orElseThrow().searchedSources());
  }

  @Test
  void aTurnWithoutFenceOrSystemMessageHasNoKnowledge() {
    GroundedTurn turn = GroundedTurn.fromProto(GroundTurnResponse.newBuilder()
        .addConversation(ChatRequests.user("Hi")).setGrounding(TurnGrounding.TURN_GROUNDING_NO_OWNERS).build());
    assertFalse(turn.isGrounded());
    assertEquals(GroundedTurn.Grounding.NO_OWNERS, turn.grounding());
    assertTrue(turn.systemText().isEmpty());
    assertEquals("", turn.knowledge());
  }

  @Test
  void valuesNewerThanTheClientReadAsUnknown() {
    GroundedTurn turn = GroundedTurn.fromProto(GroundTurnResponse.newBuilder().setGroundingValue(99)
        .addOwners(OwnerOutcome.newBuilder().setOwnerId("ada").setSearchValue(99).setFailOpenReasonValue(99))
        .build());
    assertEquals(GroundedTurn.Grounding.UNKNOWN, turn.grounding());
    assertEquals(GroundedTurn.OwnerSearch.UNKNOWN, turn.owners().get(0).search());
    assertEquals(GroundedTurn.FailOpenReason.UNKNOWN, turn.owners().get(0).failOpenReason());
  }

  @Test
  void messagesKeepNullContentAndToolCallIds() {
    ChatMessage toolCall = ChatRequests.assistant(null);
    assertFalse(toolCall.hasContent());
    assertEquals("call-1", ChatRequests.tool("call-1", "shipped").getToolCallId());
    KnowledgeScope scope = new KnowledgeScope("host", "acme", "s1");
    assertEquals("acme", ChatRequests.context(scope).getScope().getTenant());
    assertEquals("", ChatRequests.owner("ada", null).getStateText());
  }
}
