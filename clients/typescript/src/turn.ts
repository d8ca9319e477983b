// chatTurn(): a chat turn checked where it is built (the host bridge's ChatTurn.builder().build()), with the
// sidecar's GroundTurn rules (server chat/grounding.py), in its order and with its field names, so a malformed
// turn fails before any call with the ValidationError the sidecar would answer.
import { ActivityKind } from "./gen/ragsidecar/v1/chat_knowledge_pb.js";
import { KnowledgeUse } from "./gen/ragsidecar/v1/retrieval_pb.js";
import { ValidationError, type FieldViolation } from "./errors.js";
import { enumValue, type KnowledgeEntryInit, type ScopeInit } from "./knowledge.js";
import type { ActivityRecordInit, ChatOwnerInit, GroundTurnInput, TurnBindingInit } from "./chat.js";

/** The top_k of a binding opened without one, and of a SEARCH entry that declares none. */
export const CHAT_DEFAULT_TOP_K = 5;

declare const checked: unique symbol;

/** A GroundTurnInput that chatTurn() checked; frozen. Pass it to `client.chat.groundTurn` as it is. */
export type ChatTurn = GroundTurnInput & { readonly [checked]: true };

/**
 * What a turn binding is known to be: a ChatBinding handle knows its source, top_k and declared flag, so its
 * declarations are checked too; a bare `{ bindingId, ownerId }` only by its shape.
 */
interface KnownBinding extends TurnBindingInit {
  readonly source: string;
  readonly topK: number;
  readonly declared: boolean;
}

/**
 * Checks a turn the way the sidecar's GroundTurn does before it searches anything, and returns it frozen:
 * owner and binding ids (present, at most
 * 256 characters, no control characters, unique), knowledge names unique per owner, each binding of a listed
 * owner, a context only with owners, the turn's scope (a tenant; the turn's own scope equal to its context's;
 * a turn that lists bindings needs one of them), `llm.inputWindowTokens` and the activity caps; then
 * each ChatBinding handle against its owner's declarations (at most one declared binding per owner, over an
 * enabled SEARCH entry with the entry's topK; no two bindings of one owner on one source; no undeclared
 * binding on a name the owner declares). Whether a binding is still open, and in the turn's tenant and session,
 * only the sidecar knows; its resource caps, the knowledge entries' own fields and the messages' extras are
 * checked when the turn is sent. Throws ValidationError (code INVALID_ARGUMENT, reason INVALID_REQUEST, the
 * sidecar's violations) without a call; build a new turn for each send.
 */
export function chatTurn(input: GroundTurnInput): ChatTurn {
  const bindings = input.bindings ?? [];
  raise(turnProblems(input));
  raise(declarationProblems(input.owners ?? [], bindings.filter(isKnown)));
  return Object.freeze({
    ...input,
    conversation: Object.freeze([...input.conversation]),
    owners: Object.freeze([...(input.owners ?? [])]),
    bindings: Object.freeze([...bindings]),
  }) as ChatTurn;
}

// The id rules of the sidecar (server identifiers.py) and its one per-path cap. Its resource caps (messages,
// owners, bindings, characters of a text, activity entries and redaction roots) are its policy and stay with
// it: a turn over one is refused when it is sent.
const MAX_ID_CHARS = 256;
const MAX_ROOT_CHARS = 4096;

/** What converting the turn finds (the sidecar reports it first), then its shape. */
function turnProblems(turn: GroundTurnInput): FieldViolation[] {
  const problems: FieldViolation[] = [];
  const window = turn.llm?.inputWindowTokens;
  if (window !== undefined && window < 1) {
    problems.push({ field: "llm.input_window_tokens", description: "must be at least 1 when set" });
  }
  return [...problems, ...shapeProblems(turn)];
}

function shapeProblems(turn: GroundTurnInput): FieldViolation[] {
  const problems: FieldViolation[] = [];
  const owners = turn.owners ?? [];
  const listed = new Map<string, number>();
  owners.forEach((owner, i) => {
    const at = `owners[${i}].owner_id`;
    const invalid = idProblems(owner.ownerId, at, true);
    if (invalid.length > 0) problems.push(...invalid);
    else if (listed.has(owner.ownerId)) {
      problems.push({
        field: at,
        description: `owner '${owner.ownerId}' is listed twice (also owners[${listed.get(owner.ownerId)}])`,
      });
    }
    if (!listed.has(owner.ownerId)) listed.set(owner.ownerId, i);
    problems.push(...duplicateKnowledge(owner, `owners[${i}]`));
  });
  const ids = new Set<string>();
  (turn.bindings ?? []).forEach((binding, j) => {
    const invalid = idProblems(binding.bindingId, `bindings[${j}].binding_id`, true);
    if (invalid.length > 0) problems.push(...invalid);
    else if (ids.has(binding.bindingId)) {
      problems.push({ field: `bindings[${j}].binding_id`, description: "the binding is listed twice" });
    }
    ids.add(binding.bindingId);
    if (!listed.has(binding.ownerId)) {
      problems.push({ field: `bindings[${j}].owner_id`, description: `'${binding.ownerId}' is not a listed owner` });
    }
  });
  problems.push(...scopeProblems(turn));
  if (turn.activity !== undefined) problems.push(...activityProblems(turn.activity));
  return problems;
}

function scopeProblems(turn: GroundTurnInput): FieldViolation[] {
  const { context, scope } = turn;
  if (context !== undefined) {
    const problems: FieldViolation[] = [];
    if ((turn.owners ?? []).length === 0) {
      problems.push({ field: "context", description: "a retrieval context needs at least one owner" });
    }
    problems.push(...idsOf(context.scope, "context.scope"));
    if (scope !== undefined && (scope.tenant !== context.scope.tenant || (scope.session ?? "") !== (context.scope.session ?? ""))) {
      problems.push({ field: "scope", description: "differs from context.scope" });
    }
    return problems;
  }
  if (scope !== undefined) return idsOf(scope, "scope");
  if ((turn.bindings ?? []).length > 0) {
    return [{ field: "scope", description: "a turn that lists bindings needs a scope (its own or its context's)" }];
  }
  return [];
}

function idsOf(scope: ScopeInit, at: string): FieldViolation[] {
  return [...idProblems(scope.tenant, `${at}.tenant`, true), ...idProblems(scope.session ?? "", `${at}.session`, false)];
}

/** The sidecar's caller-id rules (server identifiers.id_problems). */
function idProblems(value: string, field: string, required: boolean): FieldViolation[] {
  if (isBlank(value)) return required ? [{ field, description: "required" }] : [];
  const chars = codePoints(value);
  if (chars > MAX_ID_CHARS) return [{ field, description: `longer than ${MAX_ID_CHARS} characters (${chars})` }];
  // Unicode category Cc.
  if (/\p{Cc}/u.test(value)) return [{ field, description: "contains control characters" }];
  return [];
}

/** Blank as Python's str.strip() sees it: only the characters str.isspace() accepts (not U+FEFF, unlike trim()). */
function isBlank(value: string): boolean {
  return /^[\t\n\v\f\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/.test(value);
}

function codePoints(text: string): number {
  let count = 0;
  for (const _ of text) count += 1;
  return count;
}

function duplicateKnowledge(owner: ChatOwnerInit, at: string): FieldViolation[] {
  const seen = new Set<string>();
  const problems: FieldViolation[] = [];
  (owner.knowledge ?? []).forEach((entry, k) => {
    if (seen.has(entry.name)) {
      problems.push({ field: `${at}.knowledge[${k}].name`, description: `knowledge '${entry.name}' is declared twice` });
    }
    seen.add(entry.name);
  });
  return problems;
}

const KINDS = new Set([ActivityKind.SENT, ActivityKind.RECEIVED, ActivityKind.ACTED, ActivityKind.NOTED]);

function activityProblems(record: ActivityRecordInit): FieldViolation[] {
  const problems: FieldViolation[] = [];
  (record.entries ?? []).forEach((entry, i) => {
    if (!KINDS.has(kindOf(entry.kind))) {
      problems.push({ field: `activity.entries[${i}].kind`, description: "an activity kind is required" });
    }
  });
  const caps = {
    max_entries: record.maxEntries ?? 40,
    max_total_chars: record.maxTotalChars ?? 8000,
    max_entry_chars: record.maxEntryChars ?? 400,
  };
  for (const [name, value] of Object.entries(caps)) {
    if (value < 1) problems.push({ field: `activity.${name}`, description: "must be at least 1 when set" });
  }
  if (caps.max_entry_chars > caps.max_total_chars) {
    problems.push({
      field: "activity.max_entry_chars",
      description: `${caps.max_entry_chars} exceeds max_total_chars (${caps.max_total_chars})`,
    });
  }
  (record.redactionRoots ?? []).forEach((root, i) => {
    if (isBlank(root.path) || codePoints(root.path) > MAX_ROOT_CHARS || root.path.includes("\0")) {
      problems.push({
        field: `activity.redaction_roots[${i}].path`,
        description: `required, at most ${MAX_ROOT_CHARS} characters and no NUL`,
      });
    }
  });
  return problems;
}

function kindOf(kind: string | ActivityKind): ActivityKind {
  try {
    return enumValue<ActivityKind>(ActivityKind, kind, "activity kind") ?? ActivityKind.UNSPECIFIED;
  } catch {
    return ActivityKind.UNSPECIFIED; // an unknown name: the sidecar would see no kind
  }
}

function declarationProblems(owners: readonly ChatOwnerInit[], bindings: readonly KnownBinding[]): FieldViolation[] {
  const declaredBy = new Map(owners.map((o) => [o.ownerId, new Map((o.knowledge ?? []).map((e) => [e.name, e]))]));
  const firstDeclared = new Map<string, number>();
  const sources = new Map<string, number>();
  const problems: FieldViolation[] = [];
  bindings.forEach((binding, j) => {
    const at = `bindings[${j}]`;
    const owner = binding.ownerId;
    const declared = declaredBy.get(owner) ?? new Map<string, KnowledgeEntryInit>();
    const key = JSON.stringify([owner, binding.source]);
    const same = sources.get(key);
    if (same !== undefined) {
      problems.push({ field: at, description: `owner '${owner}' already searches '${binding.source}' through bindings[${same}]` });
    } else sources.set(key, j);
    if (!binding.declared) {
      if (declared.has(binding.source)) {
        problems.push({
          field: at,
          description: `an undeclared binding may not use '${binding.source}', knowledge that owner '${owner}' declares`,
        });
      }
      return;
    }
    const first = firstDeclared.get(owner);
    if (first !== undefined) {
      problems.push({ field: at, description: `owner '${owner}' already has a declared binding (bindings[${first}])` });
    } else firstDeclared.set(owner, j);
    problems.push(...entryProblems(at, binding, declared.get(binding.source)));
  });
  return problems;
}

function entryProblems(at: string, binding: KnownBinding, entry: KnowledgeEntryInit | undefined): FieldViolation[] {
  const use = entry === undefined ? undefined : enumValue<KnowledgeUse>(KnowledgeUse, entry.use, "knowledge use");
  if (entry === undefined || entry.enabled === false || use !== KnowledgeUse.SEARCH) {
    return [{
      field: at,
      description: `declared binding source '${binding.source}' is not an enabled SEARCH entry of owner '${binding.ownerId}'`,
    }];
  }
  const k = entry.topK || CHAT_DEFAULT_TOP_K;
  if (k === binding.topK) return [];
  return [{ field: at, description: `declared binding top_k ${binding.topK} differs from '${binding.source}''s top_k ${k}` }];
}

function isKnown(binding: TurnBindingInit): binding is KnownBinding {
  const b = binding as Partial<KnownBinding>;
  return typeof b.source === "string" && b.source !== "" && typeof b.topK === "number" && typeof b.declared === "boolean";
}

function raise(problems: FieldViolation[]): void {
  if (problems.length === 0) return;
  const summary = problems.map((p) => `${p.field}: ${p.description}`).join("; ");
  throw new ValidationError(summary, { code: "INVALID_ARGUMENT", reason: "INVALID_REQUEST", violations: problems });
}
