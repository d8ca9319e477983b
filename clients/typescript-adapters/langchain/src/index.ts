// LangChain.js adapters: the sidecar's reranker as a document compressor and its Search as a retriever.
import type { CallbackManagerForRetrieverRun } from "@langchain/core/callbacks/manager";
import { Document, type DocumentInterface } from "@langchain/core/documents";
import { BaseRetriever, type BaseRetrieverInput } from "@langchain/core/retrievers";
import { BaseDocumentCompressor } from "@langchain/core/retrievers/document_compressors";
import { ValidationError, type RagSidecarClient, type Reranker, type RetrievedChunk, type SearchInput } from "@ragsidecar/client";

export interface RagSidecarRerankInput {
  /** The client (its reranker is used) or any Reranker, e.g. `client.reranker`. */
  readonly client: RagSidecarClient | Reranker;
  /**
   * A model id the sidecar serves (case-sensitive); an unknown one fails with the client's UnknownModelError. Unset:
   * the sidecar's default reranker.
   */
  readonly model?: string;
  /** Most documents kept, after scoring all of them; unset keeps every document. */
  readonly topN?: number;
  /** Drop documents whose relevance is below this threshold (0..1). */
  readonly minRelevanceScore?: number;
  /** Where a rerank that keeps nothing of a non-empty input is reported; default console.warn. */
  readonly warn?: (message: string) => void;
}

/**
 * Reranks documents with the sidecar (its default reranker unless `model` names one): the given documents (each at
 * most once, never another) in descending relevance, cut to topN after scoring, each with `metadata.relevanceScore`
 * (0..1).
 */
export class RagSidecarRerank extends BaseDocumentCompressor {
  private readonly reranker: Reranker;
  private readonly input: RagSidecarRerankInput;

  constructor(input: RagSidecarRerankInput) {
    super();
    if (input.model?.trim() === "") {
      throw new ValidationError("model must name a reranker model the sidecar serves (omit it for the sidecar's default)", { code: "INVALID_ARGUMENT", reason: "INVALID_REQUEST" });
    }
    this.reranker = "reranker" in input.client ? input.client.reranker : input.client;
    this.input = input;
  }

  async compressDocuments(documents: DocumentInterface[], query: string): Promise<DocumentInterface[]> {
    if (documents.length === 0) return [];
    const { model, topN, minRelevanceScore } = this.input;
    const response = await this.reranker.rerank({
      query,
      documents: documents.map((d) => d.pageContent),
      ...(model !== undefined ? { model } : {}),
      ...(topN !== undefined ? { topN } : {}),
      ...(minRelevanceScore !== undefined ? { minRelevanceScore } : {}),
    });
    if (response.results.length === 0) {
      (this.input.warn ?? console.warn)(`ragsidecar reranker ${model ?? "(default)"}: no result for ${documents.length} documents (minRelevanceScore or topN 0)`);
    }
    // The client checked that every result references a sent document once.
    return response.results.map((result) => {
      const original = documents[result.index]!;
      return new Document({
        pageContent: original.pageContent,
        metadata: { ...original.metadata, relevanceScore: result.relevanceScore },
        ...(original.id !== undefined ? { id: original.id } : {}),
      });
    });
  }
}

export interface RagSidecarRetrieverInput extends BaseRetrieverInput {
  readonly client: RagSidecarClient;
  /**
   * The Search request without its query: principal, scope, the target with its knowledge declarations, and
   * optionally the knowledge names to search, topK, minScore and search options.
   */
  readonly request: Omit<SearchInput, "query">;
}

/** The sidecar's Search over knowledge declarations, one Document per hit (id: the chunk id), best first. */
export class RagSidecarRetriever extends BaseRetriever {
  override lc_namespace = ["ragsidecar", "retrievers"];
  private readonly client: RagSidecarClient;
  private readonly request: Omit<SearchInput, "query">;

  constructor(input: RagSidecarRetrieverInput) {
    super(input);
    this.client = input.client;
    this.request = input.request;
  }

  override async _getRelevantDocuments(query: string, _runManager?: CallbackManagerForRetrieverRun): Promise<Document[]> {
    const result = await this.client.retrieval.search({ ...this.request, query });
    return result.hits.map(toDocument);
  }
}

function toDocument(chunk: RetrievedChunk): Document {
  const { provenance } = chunk;
  return new Document({
    id: chunk.chunkId,
    pageContent: chunk.text,
    metadata: {
      source: chunk.source,
      file: provenance.file,
      documentId: provenance.documentId,
      lineStart: provenance.lineStart,
      lineEnd: provenance.lineEnd,
      page: provenance.page,
      score: chunk.score,
      relevanceScore: chunk.scores?.rerank,
    },
  });
}

export { SidecarVectorStore, translateFilter } from "./vectorstore.js";
export type { SidecarVectorStoreFilter, SidecarVectorStoreInput } from "./vectorstore.js";
