// chatTurn(): a chat turn frozen where it is built (the host bridge's ChatTurn.builder().build()). The GroundTurn
// rules have one home, the sidecar (server chat/turn_rules.py): a malformed turn is refused when it is sent, with
// the sidecar's ValidationError and its violations, unchanged.
import type { GroundTurnInput } from "./chat.js";

declare const frozen: unique symbol;

/** A GroundTurnInput that chatTurn() froze. Pass it to `client.chat.groundTurn` as it is. */
export type ChatTurn = GroundTurnInput & { readonly [frozen]: true };

/**
 * The turn, frozen (its conversation, owners and bindings too), so that what is sent is what was built. It is
 * not checked here: `groundTurn` rejects a malformed turn with the sidecar's ValidationError (code
 * INVALID_ARGUMENT, reason INVALID_REQUEST, one violation per problem). Build a new turn for each send.
 */
export function chatTurn(input: GroundTurnInput): ChatTurn {
  return Object.freeze({
    ...input,
    conversation: Object.freeze([...input.conversation]),
    owners: Object.freeze([...(input.owners ?? [])]),
    bindings: Object.freeze([...(input.bindings ?? [])]),
  }) as ChatTurn;
}
