// A LangGraph.js BaseStore over the sidecar's MEMORY documents: namespaced JSON items, filtered and searched by the sidecar.
import {
  BaseStore,
  getTextAtPath,
  validateNamespace,
  type GetOperation,
  type Item,
  type ListNamespacesOperation,
  type MatchCondition,
  type Operation,
  type OperationResults,
  type PutOperation,
  type SearchItem,
  type SearchOperation,
} from "@langchain/langgraph-checkpoint";
import { filters, type CallerInit, type Filter, type MetadataValue, type RagSidecarClient, type StoredDocument } from "@ragsidecar/client";
import { translateFilter } from "./vectorstore.js";

/** Typed metadata key holding every prefix of an item's namespace (so a prefix search is one membership test). */
const PREFIXES = "langgraph_namespace_prefixes";
/** String metadata keys ("$": kept, never filtered) holding the item's value and namespace as JSON. */
const VALUE = "$value";
const NAMESPACE = "$namespace";
/** The longest string the sidecar keeps as typed (filterable) metadata. */
const MAX_TYPED_STRING_BYTES = 4096;
/** Most documents per ListDocuments page when the store lists. */
const PAGE = 1000;

export interface SidecarStoreInput extends CallerInit {
  readonly client: RagSidecarClient;
  /** The MEMORY knowledge name the items are kept under. */
  readonly knowledge: string;
  /** Which value fields are embedded for `search(..., { query })` (LangGraph's path syntax); default: the whole value as JSON. */
  readonly index?: { readonly fields?: readonly string[] };
  /** Expiry of every put, in milliseconds after it; unset: items never expire. Reads do not refresh it. */
  readonly ttlMs?: number;
  /** The target name the searches are declared under (what the sidecar's logs and metrics show). */
  readonly targetName?: string;
}

/**
 * LangGraph's `BaseStore` on the sidecar: each item is a MEMORY document of one knowledge name in one
 * (tenant, session), its id the JSON of `[...namespace, key]`. `put` writes the value (its top-level strings,
 * finite numbers, booleans and string arrays also as typed metadata, so `filter` can select on them; longer strings
 * than 4 KiB and nested objects are kept but not filterable) and the text the sidecar embeds (`index` fields, or
 * the value's JSON; the key when `index` is false). `search` with a `query` is the sidecar's filtered search
 * (score: cosine); without one, a listing by filter in id order. `listNamespaces` reads the matching items' namespaces
 * (its cost grows with the items under the prefix).
 */
export class SidecarStore extends BaseStore {
  private readonly input: SidecarStoreInput;

  constructor(input: SidecarStoreInput) {
    super();
    this.input = input;
  }

  async batch<Op extends Operation[]>(operations: Op): Promise<OperationResults<Op>> {
    const results: unknown[] = [];
    for (const op of operations) {
      if ("key" in op && "value" in op) results.push(await this.putItem(op as PutOperation));
      else if ("key" in op) results.push(await this.getItem(op as GetOperation));
      else if ("namespacePrefix" in op) results.push(await this.searchItems(op as SearchOperation));
      else results.push(await this.namespaces(op as ListNamespacesOperation));
    }
    return results as OperationResults<Op>;
  }

  private caller(): CallerInit & { readonly knowledge: string } {
    return { principal: this.input.principal, scope: this.input.scope, knowledge: this.input.knowledge };
  }

  private async putItem(op: PutOperation): Promise<void> {
    const id = itemId(op.namespace, op.key);
    if (op.value === null) {
      await this.input.client.retrieval.deleteDocuments({ ...this.caller(), ids: [id] });
      return;
    }
    validateNamespace(op.namespace);
    const { ttlMs } = this.input;
    await this.input.client.retrieval.upsertDocuments({
      ...this.caller(),
      documents: [{
        id,
        text: this.indexedText(op),
        metadata: { [VALUE]: JSON.stringify(op.value), [NAMESPACE]: JSON.stringify(op.namespace) },
        typedMetadata: { ...filterable(op.value), [PREFIXES]: prefixes(op.namespace) },
        ...(ttlMs !== undefined ? { expiresAt: new Date(Date.now() + ttlMs) } : {}),
      }],
    });
  }

  private indexedText(op: PutOperation): string {
    if (op.index === false) return op.key;
    const fields = op.index ?? this.input.index?.fields;
    const text = fields ? fields.flatMap((field) => getTextAtPath(op.value, field)).join("\n") : JSON.stringify(op.value);
    return text.trim() === "" ? op.key : text;
  }

  private async getItem(op: GetOperation): Promise<Item | null> {
    const found = await this.input.client.retrieval.getDocuments({ ...this.caller(), ids: [itemId(op.namespace, op.key)] });
    return found.documents[0] ? toItem(found.documents[0]) : null;
  }

  private async searchItems(op: SearchOperation): Promise<SearchItem[]> {
    const limit = op.limit ?? 10;
    const offset = op.offset ?? 0;
    const filter = this.selection(op.namespacePrefix, op.filter);
    if (!op.query) {
      const items: SearchItem[] = [];
      let pageToken = "";
      do {
        const page = await this.input.client.retrieval.listDocuments({ ...this.caller(), filter, pageSize: Math.min(PAGE, offset + limit), pageToken });
        items.push(...page.documents.map(toItem));
        pageToken = page.nextPageToken;
      } while (pageToken !== "" && items.length < offset + limit);
      return items.slice(offset, offset + limit);
    }
    const { knowledge } = this.input;
    const found = await this.input.client.retrieval.searchDocuments({
      ...this.caller(),
      target: { name: this.input.targetName ?? "SidecarStore", knowledge: [{ name: knowledge, type: "MEMORY", use: "SEARCH" }] },
      knowledge: [knowledge],
      query: op.query,
      topK: offset + limit,
      filters: { [knowledge]: filter },
    });
    return found.slice(offset).map(({ document, similarity }) => ({ ...toItem(document), score: similarity }));
  }

  private selection(namespacePrefix: readonly string[], filter: Record<string, unknown> | undefined): Filter {
    const parts: Filter[] = [];
    if (namespacePrefix.length > 0) parts.push(filters.eq(PREFIXES, JSON.stringify(namespacePrefix)));
    if (filter && Object.keys(filter).length > 0) parts.push(translateFilter(filter));
    return filters.and(...parts);
  }

  private async namespaces(op: ListNamespacesOperation): Promise<string[][]> {
    const conditions = op.matchConditions ?? [];
    const exactPrefix = conditions.find((c) => c.matchType === "prefix" && !c.path.includes("*"));
    const filter = exactPrefix ? this.selection(exactPrefix.path, undefined) : undefined;
    const seen = new Map<string, string[]>();
    let pageToken = "";
    do {
      const page = await this.input.client.retrieval.listDocuments({ ...this.caller(), ...(filter ? { filter } : {}), pageSize: PAGE, pageToken });
      for (const document of page.documents) {
        const namespace = (JSON.parse(document.metadata[NAMESPACE] as string) as string[]);
        if (!conditions.every((c) => matches(namespace, c))) continue;
        const shown = op.maxDepth !== undefined ? namespace.slice(0, op.maxDepth) : namespace;
        seen.set(JSON.stringify(shown), shown);
      }
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    const sorted = [...seen.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, namespace]) => namespace);
    return sorted.slice(op.offset, op.offset + op.limit);
  }
}

/** An unambiguous id: the JSON array of the namespace's labels and the key. */
function itemId(namespace: readonly string[], key: string): string {
  return JSON.stringify([...namespace, key]);
}

function prefixes(namespace: readonly string[]): string[] {
  return namespace.map((_, i) => JSON.stringify(namespace.slice(0, i + 1)));
}

function filterable(value: Record<string, unknown>): Record<string, MetadataValue> {
  const out: Record<string, MetadataValue> = {};
  for (const [key, v] of Object.entries(value)) {
    if (key === PREFIXES || key.startsWith("$") || key.length === 0 || key.length > 256 || /\p{Cc}/u.test(key)) continue;
    if (typeof v === "string" && Buffer.byteLength(v) <= MAX_TYPED_STRING_BYTES) out[key] = v;
    else if (typeof v === "boolean" || (typeof v === "number" && Number.isFinite(v))) out[key] = v;
    else if (Array.isArray(v) && v.length <= 256 && v.every((s) => typeof s === "string" && Buffer.byteLength(s) <= MAX_TYPED_STRING_BYTES)) out[key] = v as string[];
  }
  return out;
}

function toItem(document: StoredDocument): Item {
  const namespace = JSON.parse(document.metadata[NAMESPACE] as string) as string[];
  const labels = JSON.parse(document.id) as string[];
  return {
    namespace,
    key: labels[labels.length - 1]!,
    value: JSON.parse(document.metadata[VALUE] as string) as Record<string, unknown>,
    createdAt: document.created ?? new Date(0),
    updatedAt: document.updated ?? new Date(0),
  };
}

function matches(namespace: readonly string[], condition: MatchCondition): boolean {
  const { path } = condition;
  if (path.length > namespace.length) return false;
  const part = condition.matchType === "prefix" ? namespace.slice(0, path.length) : namespace.slice(namespace.length - path.length);
  return path.every((label, i) => label === "*" || label === part[i]);
}
