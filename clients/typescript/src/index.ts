export { RERANKER_HEALTH_SERVICE, createClient } from "./client.js";
export type { ClientOptions, HealthClient, HealthStatus, RagSidecarClient } from "./client.js";
export type { ConnectionOptions, TlsOptions } from "./transport.js";
export type { CallOptions } from "./call.js";
export { DEFAULT_DEADLINES_MS, DEFAULT_RETRY, callKind } from "./retry.js";
export type { CallKind, RetryOptions } from "./retry.js";
export { noOpReranker } from "./reranker.js";
export type {
  LongDocumentStrategyName,
  ModelInfo,
  ModelKindName,
  ModelSnapshot,
  ModelStateName,
  RankedDocument,
  RerankDocument,
  Reranker,
  RerankRequest,
  RerankResponse,
  RerankTiming,
  RerankUsage,
  SentDocument,
  SnapshotOptions,
} from "./reranker.js";
export type { TypedServiceClient } from "./services.js";
export { chatTurn } from "./turn.js";
export type { ChatTurn } from "./turn.js";
export type {
  ActivityEntryInit,
  ActivityKindName,
  ActivityRecordInit,
  AppendResult,
  AppendToBindingInput,
  BindingRefInit,
  BindingShape,
  ChatBinding,
  ChatClient,
  ChatMessage,
  ChatMessageInit,
  ChatOwnerInit,
  ChatRetrievalContextInit,
  ChatRole,
  CloseBindingInput,
  FailOpenReasonName,
  GroundTurnInput,
  GroundTurnResult,
  InvalidateBindingInput,
  InvalidateResult,
  OpenBindingInput,
  OwnerOutcome,
  OwnerSearchName,
  TurnBindingInit,
  TurnGroundingName,
} from "./chat.js";
export type {
  ActionInit,
  CallerInit,
  ChatKnowledgePreparation,
  ConfigurationViolation,
  ContextBlock,
  DeleteDocumentsInput,
  DeleteResult,
  GetDocumentsInput,
  GetDocumentsResult,
  ListDocumentsInput,
  ListDocumentsResult,
  ScoredDocument,
  DirectKnowledgeBlock,
  EnforceInput,
  EnforceResult,
  HitScores,
  KnowledgeEntryInit,
  KnowledgeOnFailureName,
  RerankOrderName,
  RetrievalModeName,
  KnowledgeReadinessName,
  KnowledgeTypeName,
  KnowledgeUseName,
  LlmInit,
  MemoryDocumentInit,
  ParamsInit,
  PrepareChatKnowledgeInput,
  PrincipalInit,
  Provenance,
  RequireLoadedInput,
  RequireReadyInput,
  RetrievalClient,
  RetrievalTiming,
  RetrievalUsage,
  RetrievedChunk,
  ScopeInit,
  SearchInput,
  SearchOptionsInit,
  SearchResult,
  SourceCount,
  StaleFallback,
  TargetInit,
  TargetRequestInit,
  UpsertDocumentsInput,
  UpsertResult,
  ValidateConfigurationInput,
  ValidationResult,
} from "./retrieval.js";
export {
  CancelledError,
  DeadlineExceededError,
  ERROR_DOMAIN,
  FailedPreconditionError,
  KnowledgeNotReadyError,
  NotFoundError,
  PermissionDeniedError,
  RagSidecarError,
  ResourceExhaustedError,
  UnauthenticatedError,
  UnavailableError,
  UnimplementedError,
  UnknownBindingError,
  UnknownModelError,
  ValidationError,
  toRagSidecarError,
} from "./errors.js";
export type { FieldViolation, RagSidecarErrorInit, StatusCodeName } from "./errors.js";
export {
  RetrievalBudgetError,
  RetrievalDuplicateError,
  RetrievalRejectedError,
  canonicalKey,
  defineSidecarRetrieval,
} from "./lifecycle.js";
export type {
  OperationContext,
  RetrievalEffect,
  RetrievalReason,
  RetrievalReceipt,
  RetrievalResult,
  RetrievalSource,
  RetrievalState,
  SearchRequestInit,
  SidecarRetrievalDefinition,
  SidecarRetrievalRunner,
  SidecarSearchResult,
  SidecarSource,
} from "./lifecycle.js";
/** The generated messages and service descriptors of the sidecar's contracts. */
export { FILTER_FIELDS, filters } from "./memory.js";
export type { ComparisonOperatorName, Filter, MetadataValue, StoredDocument } from "./memory.js";
export * as reranker_pb from "./gen/ragsidecar/v1/reranker_pb.js";
export * as retrieval_pb from "./gen/ragsidecar/v1/retrieval_pb.js";
export * as chat_knowledge_pb from "./gen/ragsidecar/v1/chat_knowledge_pb.js";
export * as common_pb from "./gen/ragsidecar/v1/common_pb.js";
