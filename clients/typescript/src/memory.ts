// Typed MEMORY metadata and the filter language: plain values and plain filter objects in, proto messages out.
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import {
  ComparisonOperator,
  type FilterSchema,
  type MemoryDocument as MemoryDocumentMessage,
  type MetadataValue as MetadataValueMessage,
  type MetadataValueSchema,
} from "./gen/ragsidecar/v1/retrieval_pb.js";

/**
 * A typed metadata value: a string, a finite number, a boolean, an instant (`Date`) or a list of strings (tags).
 * Read back, values have the same JavaScript types.
 */
export type MetadataValue = string | number | boolean | Date | readonly string[];

/** The comparison operators of a filter. */
export type ComparisonOperatorName = "==" | "!=" | "<" | "<=" | ">" | ">=";

/**
 * A filter over documents (docs/memory.md gives the language): a comparison of a field with a value, a membership
 * (`in` / `not in`), `exists`, and `and` / `or` / `not`. A field is a metadata key or a reserved name: "$id",
 * "$created", "$updated", "$expires_at" (and "$path", "$file_name" for FILE and DIRECTORY chunks). A document
 * lacking the field matches no comparison but `!=`, and no membership but `not in`; a string-list field equals
 * each string it holds. `filters` builds them.
 */
export type Filter =
  | { readonly field: string; readonly op: ComparisonOperatorName; readonly value: MetadataValue }
  | { readonly field: string; readonly op: "in" | "not in"; readonly values: readonly MetadataValue[] }
  | { readonly exists: string }
  | { readonly and: readonly Filter[] }
  | { readonly or: readonly Filter[] }
  | { readonly not: Filter };

/** Builders of `Filter` objects. */
export const filters = {
  eq: (field: string, value: MetadataValue): Filter => ({ field, op: "==", value }),
  ne: (field: string, value: MetadataValue): Filter => ({ field, op: "!=", value }),
  lt: (field: string, value: MetadataValue): Filter => ({ field, op: "<", value }),
  lte: (field: string, value: MetadataValue): Filter => ({ field, op: "<=", value }),
  gt: (field: string, value: MetadataValue): Filter => ({ field, op: ">", value }),
  gte: (field: string, value: MetadataValue): Filter => ({ field, op: ">=", value }),
  in: (field: string, values: readonly MetadataValue[]): Filter => ({ field, op: "in", values }),
  notIn: (field: string, values: readonly MetadataValue[]): Filter => ({ field, op: "not in", values }),
  exists: (field: string): Filter => ({ exists: field }),
  and: (...all: Filter[]): Filter => ({ and: all }),
  or: (...any: Filter[]): Filter => ({ or: any }),
  not: (filter: Filter): Filter => ({ not: filter }),
  /** Keeps every document (an empty `and`); with deleteDocuments it deletes them all. */
  everything: (): Filter => ({ and: [] }),
} as const;

/** Reserved filter fields. */
export const FILTER_FIELDS = {
  id: "$id",
  created: "$created",
  updated: "$updated",
  expiresAt: "$expires_at",
  path: "$path",
  fileName: "$file_name",
} as const;

const OPERATORS: Record<ComparisonOperatorName, ComparisonOperator> = {
  "==": ComparisonOperator.EQUAL,
  "!=": ComparisonOperator.NOT_EQUAL,
  "<": ComparisonOperator.LESS,
  "<=": ComparisonOperator.LESS_OR_EQUAL,
  ">": ComparisonOperator.GREATER,
  ">=": ComparisonOperator.GREATER_OR_EQUAL,
};

/** The proto init of a metadata value; a value of another type is a TypeError naming `where`. */
export function toMetadataValue(value: MetadataValue, where: string): MessageInitShape<typeof MetadataValueSchema> {
  if (typeof value === "string") return { kind: { case: "stringValue", value } };
  if (typeof value === "boolean") return { kind: { case: "boolValue", value } };
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError(`${where}: a metadata number must be finite, not ${value}`);
    return { kind: { case: "numberValue", value } };
  }
  if (value instanceof Date) return { kind: { case: "timestampValue", value: timestampFromDate(value) } };
  if (Array.isArray(value) && value.every((item) => typeof item === "string")) {
    return { kind: { case: "stringListValue", value: { values: [...value] } } };
  }
  throw new TypeError(`${where}: not a metadata value (string, number, boolean, Date or string[]): ${describe(value)}`);
}

/** The proto init of each entry. */
export function toMetadataValues(values: Readonly<Record<string, MetadataValue>>, where: string) {
  return Object.fromEntries(Object.entries(values).map(([key, value]) => [key, toMetadataValue(value, `${where}["${key}"]`)]));
}

/** The JavaScript value of a metadata value. */
export function fromMetadataValue(value: MetadataValueMessage): MetadataValue {
  switch (value.kind.case) {
    case "stringValue":
    case "numberValue":
    case "boolValue":
      return value.kind.value;
    case "timestampValue":
      return timestampDate(value.kind.value);
    case "stringListValue":
      return [...value.kind.value.values];
    default:
      throw new TypeError("a metadata value without a kind");
  }
}

/** The JavaScript values of a metadata map. */
export function fromMetadataValues(values: { readonly [key: string]: MetadataValueMessage }): Record<string, MetadataValue> {
  return Object.fromEntries(Object.entries(values).map(([key, value]) => [key, fromMetadataValue(value)]));
}

/** The proto init of a filter; a malformed one is a TypeError naming the part (`where`, e.g. "filter.and[1]"). */
export function toFilter(filter: Filter, where = "filter"): MessageInitShape<typeof FilterSchema> {
  if ("and" in filter) return { kind: { case: "all", value: { filters: filter.and.map((f, i) => toFilter(f, `${where}.and[${i}]`)) } } };
  if ("or" in filter) return { kind: { case: "any", value: { filters: filter.or.map((f, i) => toFilter(f, `${where}.or[${i}]`)) } } };
  if ("not" in filter) return { kind: { case: "negation", value: toFilter(filter.not, `${where}.not`) } };
  if ("exists" in filter) return { kind: { case: "exists", value: { field: filter.exists } } };
  if ("values" in filter && (filter.op === "in" || filter.op === "not in")) {
    return {
      kind: {
        case: "membership",
        value: { field: filter.field, values: filter.values.map((v, i) => toMetadataValue(v, `${where}.values[${i}]`)), negated: filter.op === "not in" },
      },
    };
  }
  if ("value" in filter && filter.op in OPERATORS) {
    return { kind: { case: "comparison", value: { field: filter.field, operator: OPERATORS[filter.op], value: toMetadataValue(filter.value, `${where}.value`) } } };
  }
  throw new TypeError(`${where}: not a filter: ${describe(filter)}`);
}

/** A MEMORY document as the sidecar holds it (getDocuments, listDocuments). */
export interface StoredDocument {
  readonly id: string;
  readonly text: string;
  /** Its typed metadata and its string metadata (as strings). */
  readonly metadata: Readonly<Record<string, MetadataValue>>;
  /** When it expires; undefined when it never does. */
  readonly expiresAt: Date | undefined;
  /** When its id was first written (server clock). */
  readonly created: Date | undefined;
  /** When it last changed. */
  readonly updated: Date | undefined;
}

export function fromStoredDocument(d: MemoryDocumentMessage): StoredDocument {
  return {
    id: d.id,
    text: d.text,
    metadata: { ...d.metadata, ...fromMetadataValues(d.typedMetadata) },
    expiresAt: d.expiresAt ? timestampDate(d.expiresAt) : undefined,
    created: d.created ? timestampDate(d.created) : undefined,
    updated: d.updated ? timestampDate(d.updated) : undefined,
  };
}

function describe(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
