// A LangChain.js VectorStore over the sidecar's MEMORY documents: the sidecar embeds, filters and searches.
import type { Callbacks } from "@langchain/core/callbacks/manager";
import { Document, type DocumentInterface } from "@langchain/core/documents";
import { Embeddings } from "@langchain/core/embeddings";
import { VectorStore } from "@langchain/core/vectorstores";
import { filters, type CallerInit, type Filter, type MetadataValue, type RagSidecarClient, type StoredDocument } from "@ragsidecar/client";

/**
 * A filter in the Mongo-style syntax LangChain.js stores share: `{ key: value }` (equality), `{ key: { $op: value } }`
 * with `$eq`, `$ne`, `$lt`, `$lte`, `$gt`, `$gte`, `$in`, `$nin`, `$exists`, and `$and`, `$or` (lists) and `$not`.
 * Several keys in one object must all match.
 */
export type SidecarVectorStoreFilter = { readonly [key: string]: unknown };

export interface SidecarVectorStoreInput extends CallerInit {
  readonly client: RagSidecarClient;
  /** The MEMORY knowledge name the documents are kept under. */
  readonly knowledge: string;
  /** Expiry of added documents, in milliseconds after addDocuments; unset: they never expire. */
  readonly ttlMs?: number;
  /** The target name the searches are declared under (what the sidecar's logs and metrics show). */
  readonly targetName?: string;
}

/** The store's stand-in for an embedding model: the sidecar embeds the text itself, so it is never asked for vectors. */
class SidecarEmbedsText extends Embeddings {
  constructor() {
    super({});
  }

  embedDocuments(): Promise<number[][]> {
    return Promise.reject(new Error("SidecarVectorStore: the sidecar embeds the text itself; there are no vectors to compute here"));
  }

  embedQuery(): Promise<number[]> {
    return this.embedDocuments().then(() => []);
  }
}

/**
 * A LangChain.js `VectorStore` whose documents are the sidecar's MEMORY documents of one knowledge name in one
 * (tenant, session). The sidecar chunks and embeds the text: `similaritySearch(query, k, filter)` sends the query
 * text, `addDocuments` the documents' text and metadata, `delete({ ids })` or `delete({ filter })` removes them.
 * Vectors are never exchanged: `addVectors` and `similaritySearchVectorWithScore` throw.
 */
export class SidecarVectorStore extends VectorStore {
  declare FilterType: SidecarVectorStoreFilter;
  private readonly client: RagSidecarClient;
  private readonly input: SidecarVectorStoreInput;

  constructor(input: SidecarVectorStoreInput) {
    super(new SidecarEmbedsText(), {});
    this.client = input.client;
    this.input = input;
  }

  _vectorstoreType(): string {
    return "ragsidecar";
  }

  /**
   * Upserts the documents by id (`options.ids`, else each document's `id`, else a random UUID), with their
   * metadata typed: strings, finite numbers, booleans, Dates and string arrays; another value (a nested object
   * such as a text splitter's `loc`, null) throws a TypeError naming the key. Returns the ids.
   */
  override async addDocuments(documents: DocumentInterface[], options?: { readonly ids?: string[] }): Promise<string[]> {
    const given = options?.ids;
    const ids = documents.map((d, i) => given?.[i] ?? d.id ?? crypto.randomUUID());
    const { ttlMs } = this.input;
    const expiresAt = ttlMs !== undefined ? new Date(Date.now() + ttlMs) : undefined;
    if (documents.length === 0) return [];
    await this.client.retrieval.upsertDocuments({
      ...this.caller(),
      knowledge: this.input.knowledge,
      documents: documents.map((d, i) => ({
        id: ids[i]!,
        text: d.pageContent,
        typedMetadata: typedMetadata(d.metadata, ids[i]!),
        ...(expiresAt ? { expiresAt } : {}),
      })),
    });
    return ids;
  }

  addVectors(): Promise<void> {
    return Promise.reject(new Error("SidecarVectorStore stores text, which the sidecar embeds: use addDocuments"));
  }

  similaritySearchVectorWithScore(): Promise<[DocumentInterface, number][]> {
    return Promise.reject(new Error("SidecarVectorStore searches by the query's text, which the sidecar embeds: use similaritySearch"));
  }

  override async similaritySearch(query: string, k = 4, filter?: this["FilterType"], _callbacks?: Callbacks): Promise<DocumentInterface[]> {
    return (await this.similaritySearchWithScore(query, k, filter)).map(([document]) => document);
  }

  /**
   * The k documents best matching the query (each once, whole, with the metadata it was added with), each with the
   * cosine similarity of the query and its best chunk, best first.
   */
  override async similaritySearchWithScore(query: string, k = 4, filter?: this["FilterType"], _callbacks?: Callbacks): Promise<[DocumentInterface, number][]> {
    const { knowledge } = this.input;
    const found = await this.client.retrieval.searchDocuments({
      ...this.caller(),
      target: { name: this.input.targetName ?? "SidecarVectorStore", knowledge: [{ name: knowledge, type: "MEMORY", use: "SEARCH" }] },
      knowledge: [knowledge],
      query,
      topK: k,
      ...(filter ? { filters: { [knowledge]: translateFilter(filter) } } : {}),
    });
    return found.map(({ document, similarity }) => [toDocument(document), similarity]);
  }

  /** Deletes by `ids`, or every document a `filter` keeps; one of the two. */
  override async delete(params?: { ids?: string[]; filter?: SidecarVectorStoreFilter }): Promise<void> {
    if (params?.ids && params.filter) throw new TypeError("SidecarVectorStore.delete takes ids or a filter, not both");
    if (params?.ids) {
      if (params.ids.length > 0) await this.client.retrieval.deleteDocuments({ ...this.caller(), knowledge: this.input.knowledge, ids: params.ids });
      return;
    }
    if (params?.filter) {
      await this.client.retrieval.deleteDocuments({ ...this.caller(), knowledge: this.input.knowledge, filter: translateFilter(params.filter) });
      return;
    }
    throw new TypeError("SidecarVectorStore.delete needs { ids } or { filter }");
  }

  private caller(): CallerInit {
    return { principal: this.input.principal, scope: this.input.scope };
  }
}

function typedMetadata(metadata: Record<string, unknown>, id: string): Record<string, MetadataValue> {
  const out: Record<string, MetadataValue> = {};
  for (const [key, value] of Object.entries(metadata)) {
    if (value === undefined) continue;
    if (typeof value === "string" || typeof value === "boolean" || value instanceof Date
      || (typeof value === "number" && Number.isFinite(value))
      || (Array.isArray(value) && value.every((item) => typeof item === "string"))) {
      out[key] = value as MetadataValue;
    } else {
      throw new TypeError(`SidecarVectorStore: document ${id}: metadata "${key}" is not a string, finite number, boolean, Date or string[]: ${JSON.stringify(value)}`);
    }
  }
  return out;
}

function toDocument(stored: StoredDocument): Document {
  return new Document({ id: stored.id, pageContent: stored.text, metadata: { ...stored.metadata } });
}

/** The sidecar's reserved fields a filter may name like metadata keys. */
const RESERVED_FIELDS = new Set(["$id", "$created", "$updated", "$expires_at"]);

const COMPARISONS: Record<string, (field: string, value: MetadataValue) => Filter> = {
  $eq: filters.eq,
  $ne: filters.ne,
  $lt: filters.lt,
  $lte: filters.lte,
  $gt: filters.gt,
  $gte: filters.gte,
};

/**
 * The Mongo-style filter as the sidecar's (docs/memory.md, "Framework mappings"); what has no counterpart
 * (`$regex`, `$like`, a function, a nested document) throws a TypeError naming it.
 */
export function translateFilter(filter: SidecarVectorStoreFilter, where = "filter"): Filter {
  if (typeof filter !== "object" || filter === null || Array.isArray(filter)) {
    throw untranslatable(where, filter, "a filter is an object of keys and conditions");
  }
  const parts = Object.entries(filter).map(([key, condition]) => translateEntry(key, condition, `${where}.${key}`));
  return parts.length === 1 ? parts[0]! : filters.and(...parts);
}

function translateEntry(key: string, condition: unknown, where: string): Filter {
  if (key === "$and" || key === "$or") {
    if (!Array.isArray(condition)) throw untranslatable(where, condition, `${key} takes a list of filters`);
    const list = condition.map((f, i) => translateFilter(f as SidecarVectorStoreFilter, `${where}[${i}]`));
    return key === "$and" ? filters.and(...list) : filters.or(...list);
  }
  if (key === "$not") return filters.not(translateFilter(condition as SidecarVectorStoreFilter, where));
  if (key.startsWith("$") && !RESERVED_FIELDS.has(key)) {
    throw untranslatable(where, condition, `operator ${key} has no counterpart`);
  }
  if (!isOperatorObject(condition)) return filters.eq(key, metadataValue(condition, where));
  const parts = Object.entries(condition).map(([op, value]) => {
    const compare = COMPARISONS[op];
    if (compare) return compare(key, metadataValue(value, `${where}.${op}`));
    if (op === "$in" || op === "$nin") {
      if (!Array.isArray(value)) throw untranslatable(`${where}.${op}`, value, `${op} takes a list`);
      const values = value.map((v, i) => metadataValue(v, `${where}.${op}[${i}]`));
      return op === "$in" ? filters.in(key, values) : filters.notIn(key, values);
    }
    if (op === "$exists") return value ? filters.exists(key) : filters.not(filters.exists(key));
    throw untranslatable(`${where}.${op}`, value, `operator ${op} has no counterpart`);
  });
  return parts.length === 1 ? parts[0]! : filters.and(...parts);
}

function isOperatorObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Date)
    && Object.keys(value).length > 0 && Object.keys(value).every((k) => k.startsWith("$"));
}

function metadataValue(value: unknown, where: string): MetadataValue {
  if (typeof value === "string" || typeof value === "number" || typeof value === "boolean" || value instanceof Date) return value;
  if (Array.isArray(value) && value.every((item) => typeof item === "string")) return value as string[];
  throw untranslatable(where, value, "not a string, number, boolean, Date or string[]");
}

function untranslatable(where: string, value: unknown, why: string): TypeError {
  return new TypeError(`cannot translate the filter to the sidecar's: ${where} (${JSON.stringify(value) ?? String(value)}): ${why}`);
}
